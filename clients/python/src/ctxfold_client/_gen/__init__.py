"""Generated from proto/ctxfold/v1 by clients/python/generate.sh. Do not edit."""
