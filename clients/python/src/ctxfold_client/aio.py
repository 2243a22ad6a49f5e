"""The asyncio client: `from ctxfold_client.aio import AsyncClient` (also exported by the package)."""

from ctxfold_client._async_client import AsyncClient

__all__ = ["AsyncClient"]
