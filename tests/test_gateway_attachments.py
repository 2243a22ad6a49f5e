"""A fold that removes a message with an image names the image in the summary and never carries the
image's data (the canonical text describes it; the payload stays with the message)."""

from __future__ import annotations

from gateway_fixtures import Stack, anthropic_agent, stack
from test_gateway_anthropic import png

__all__ = ["stack"]


async def test_a_fold_names_an_image_and_never_carries_it(stack: Stack) -> None:
    agent = anthropic_agent(stack.url, "folded-image", "sk-ant")
    data = png(1280, 800)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    messages = [
        {"role": "user", "content": "Review the UI as we go."},
        {"role": "assistant", "content": "Send me screens."},
        {"role": "user", "content": [image, {"type": "text", "text": "The login screen."}]},
        {"role": "assistant", "content": "The button is misaligned."},
        {"role": "user", "content": "Anything else?"},
    ]
    raw = await agent.messages.with_raw_response.create(model="claude-sonnet-4-6", max_tokens=256, messages=messages)  # type: ignore[arg-type]
    view = await stack.ctxfold.compact(raw.headers["x-ctxfold-session"])
    assert view.summary is not None
    assert "[image: image/png, 1280x800]" in view.summary.content
    assert data[:40] not in view.summary.content
    listed = await stack.transcript(raw.headers["x-ctxfold-session"])
    assert listed[2].provider_payload is not None and data in listed[2].provider_payload.json
