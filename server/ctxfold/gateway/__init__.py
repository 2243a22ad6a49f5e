"""The provider-compatible HTTP gateway: agents change only their base URL and get ctxfold.

It speaks OpenAI Chat Completions, OpenAI Responses and Anthropic Messages, and is a client of
ContextService through the Python SDK, nothing else (docs/gateway.md)."""

from ctxfold.gateway.app import RunningGateway, start_gateway
from ctxfold.gateway.settings import GatewaySettings, load_gateway_settings

__all__ = ["GatewaySettings", "RunningGateway", "load_gateway_settings", "start_gateway"]
