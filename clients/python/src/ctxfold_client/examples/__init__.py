"""Runnable examples of the ctxfold client SDK."""
