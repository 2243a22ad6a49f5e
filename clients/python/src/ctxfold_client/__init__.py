"""Python client SDK for ctxfold: keeps an LLM agent's transcript on the ctxfold service and gets,
before every model request, the provider-visible context that fits the model's window.

    from ctxfold_client import Client, SessionConfig, adapters, user

    with Client("127.0.0.1:50051") as client:
        session = client.create_session(SessionConfig(context_window=128_000, max_output_tokens=4096))
        view = client.prepare(session.id, [user("Fix the failing test")], on_progress=print)
        request = adapters.openai_chat.to_request(view, tools=session.config.tools)  # + model: send it

`AsyncClient` offers the same API for asyncio (one implementation: the blocking client is generated
from it). Results are typed dataclasses; the generated protobuf types are `ctxfold_client.pb`.
"""

from ctxfold_client import adapters
from ctxfold_client._async_client import AsyncClient
from ctxfold_client._gen import context_service_pb2 as pb
from ctxfold_client._gen.enums import Action, CacheState, ErrorReason, FoldStage, NotFoldedReason, Role
from ctxfold_client._sync_client import Client
from ctxfold_client._version import VERSION
from ctxfold_client.adapters import ProviderTurn
from ctxfold_client.config import SessionConfig
from ctxfold_client.errors import CLIENT_DOMAIN, SERVER_DOMAIN, CtxfoldError
from ctxfold_client.messages import assistant, system, tool_call, tool_result, user
from ctxfold_client.models import (
    CallOptions,
    Checkpoint,
    ContextState,
    FoldProgress,
    Message,
    ProviderPayload,
    Session,
    ToolCall,
    ToolResult,
    ToolResultPage,
    Usage,
    UsageResult,
    View,
)
from ctxfold_client.tools import tool_definitions
from ctxfold_client.tracing import trace_metadata

__version__ = VERSION

__all__ = [
    "CLIENT_DOMAIN",
    "SERVER_DOMAIN",
    "VERSION",
    "Action",
    "AsyncClient",
    "CacheState",
    "CallOptions",
    "Checkpoint",
    "Client",
    "ContextState",
    "CtxfoldError",
    "ErrorReason",
    "FoldProgress",
    "FoldStage",
    "Message",
    "NotFoldedReason",
    "ProviderPayload",
    "ProviderTurn",
    "Role",
    "Session",
    "SessionConfig",
    "ToolCall",
    "ToolResult",
    "ToolResultPage",
    "Usage",
    "UsageResult",
    "View",
    "__version__",
    "adapters",
    "assistant",
    "pb",
    "system",
    "tool_call",
    "tool_definitions",
    "tool_result",
    "trace_metadata",
    "user",
]
