"""Provider adapters: a View as the request of a provider API, and a provider response as the
messages to append plus the `Usage` to report with `observe_usage()` (clients/README.md,
"Provider adapters"). They work on plain JSON-shaped dicts, so no provider SDK is required; a
response object of the official `openai` or `anthropic` SDK is accepted too (via `model_dump()`).

    request = adapters.anthropic_messages.to_request(view)       # + model, max_tokens, tools
    reply = adapters.anthropic_messages.from_response(response)  # ProviderTurn(messages, usage)
"""

from ctxfold_client.adapters import anthropic_messages, openai_chat, openai_responses
from ctxfold_client.adapters._common import ProviderTurn

__all__ = ["ProviderTurn", "anthropic_messages", "openai_chat", "openai_responses"]
