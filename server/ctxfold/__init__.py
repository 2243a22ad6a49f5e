"""ctxfold: context maintenance for long-running LLM agents."""

__version__ = "0.1.0"
