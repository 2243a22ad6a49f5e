"""The gateway under the official OpenAI and Anthropic Node SDKs (pinned in package.json): the agent
loops of tests/node/gateway_agents.mjs run unchanged against it, with the fake upstream scripted
here, streaming and not, parallel tool calls, thinking signatures and encrypted reasoning."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from fake_upstream import CHAT, MESSAGES, RESPONSES, Call, Reply
from gateway_fixtures import Stack, stack

__all__ = ["stack"]

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "node" / "gateway_agents.mjs"
SIGNATURE = "ErUBCkYIBRgCIkD/node+sig=="


async def test_node_agents_run_unchanged_through_the_gateway(stack: Stack) -> None:
    node = shutil.which("node")
    if node is None or not (ROOT / "node_modules" / "openai").is_dir():
        pytest.fail("node and the npm packages are needed: run `make setup`")
    reads = (Call("call_a", "read_file", '{"p":"a.py"}'), Call("call_b", "read_file", '{"p":"b.py"}'))
    stack.upstream.reply(CHAT, Reply(text="", calls=reads), Reply(text="Both read."))
    thinking = Reply(text="", thinking=(("Look first.", SIGNATURE),), calls=(Call("toolu_9", "bash", '{"c":"ls"}'),))
    stack.upstream.reply(MESSAGES, thinking, Reply(text="Two files."))
    stack.upstream.reply(
        RESPONSES, Reply(text="", calls=(Call("call_r", "ls", "{}"),), reasoning=(("Listing.", "gAAAA-node"),)),
        Reply(text="a.py and b.py"),
    )  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        node, str(SCRIPT), stack.url, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, stderr.decode()
    seen = json.loads(stdout)

    assert seen["chat"]["calls"] == 2 and seen["chat"]["answer"] == "Both read."
    assert stack.upstream.last(CHAT).body["messages"] == seen["chat"]["sent"]
    transcript = await stack.transcript(seen["chat"]["session"])
    assert [m.role.name for m in transcript] == ["SYSTEM", "USER", "ASSISTANT", "TOOL", "TOOL"]

    assert seen["anthropic"] == {"signature": SIGNATURE, "answer": "Two files."}
    anthropic = stack.upstream.last(MESSAGES)
    assert f'"signature":"{SIGNATURE}"'.encode() in anthropic.raw
    assert anthropic.body["stream"] is True

    assert seen["responses"]["answer"] == "a.py and b.py"
    sent = stack.upstream.last(RESPONSES).body["input"]
    assert next(i for i in sent if i.get("type") == "reasoning")["encrypted_content"] == "gAAAA-node"
    assert len(sent) == seen["responses"]["items"]
