"""The SDK version: the installed distribution's (pyproject.toml), equal to the repository's VERSION."""

from importlib import metadata

VERSION = metadata.version("ctxfold-client")
