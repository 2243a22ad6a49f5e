"""Generated from proto/ctxfold/v1 by proto/generate.py. Do not edit."""
