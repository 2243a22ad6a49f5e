"""The provider-compatible HTTP gateway: agents change only their base URL and get ctxfold.

It speaks OpenAI Chat Completions, OpenAI Responses and Anthropic Messages, and is a client of
ContextService through the Python SDK, nothing else (docs/gateway.md). `app` is the HTTP shell;
`settings` is importable without loading gRPC (the CLI reads it before gRPC starts)."""
