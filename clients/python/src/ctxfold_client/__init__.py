"""Python client SDK for ctxfold: keeps an LLM agent's transcript on the ctxfold service and gets,
before every model request, the provider-visible context that fits the model's window.

    from ctxfold_client import Client, SessionConfig, to_openai_messages, user

    with Client("127.0.0.1:50051") as client:
        session = client.create_session(SessionConfig(context_window=128_000, max_output_tokens=4096))
        view = client.prepare(session.id, [user("Fix the failing test")], on_progress=print)
        messages = to_openai_messages(view)  # send these to the model

`AsyncClient` (in `ctxfold_client.aio`) offers the same API for asyncio. The generated protobuf
types are available as `ctxfold_client.pb`.
"""

from ctxfold_client._gen import context_service_pb2 as pb
from ctxfold_client.aio import AsyncClient
from ctxfold_client.client import Client
from ctxfold_client.config import SessionConfig
from ctxfold_client.errors import CtxfoldError
from ctxfold_client.messages import assistant, system, tool_call, tool_result, user
from ctxfold_client.models import (
    Action,
    CacheState,
    CallOptions,
    FoldProgress,
    FoldStage,
    PreparedView,
    Role,
    ToolResult,
)
from ctxfold_client.openai_chat import from_openai_message, to_openai_message, to_openai_messages
from ctxfold_client.tracing import trace_metadata

__version__ = "0.1.0"

__all__ = [
    "Action",
    "AsyncClient",
    "CacheState",
    "CallOptions",
    "Client",
    "CtxfoldError",
    "FoldProgress",
    "FoldStage",
    "PreparedView",
    "Role",
    "SessionConfig",
    "ToolResult",
    "__version__",
    "assistant",
    "from_openai_message",
    "pb",
    "system",
    "to_openai_message",
    "to_openai_messages",
    "tool_call",
    "tool_result",
    "trace_metadata",
    "user",
]
