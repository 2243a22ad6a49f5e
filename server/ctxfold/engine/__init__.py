"""The pure core: no I/O, no imports from store/, service/, api/ or summarizers/."""
