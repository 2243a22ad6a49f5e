"""ctxfold: context maintenance for long-running LLM agents."""

from importlib.metadata import version

# From the installed package metadata, whose version is the repository's VERSION file.
__version__ = version("ctxfold")
