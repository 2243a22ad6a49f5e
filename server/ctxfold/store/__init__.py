"""Persistence: SQLAlchemy Core tables, the repository and Alembic migrations."""
