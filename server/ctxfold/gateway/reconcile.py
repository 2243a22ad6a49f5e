"""History reconciliation: agents resend their whole history on every call; the gateway matches it
against the session's transcript by per-message fingerprints. An identical prefix appends the new
suffix; a divergence (an edited or retried message, the agent's own compaction, a message gone)
rewinds the transcript to the last common message and appends the rest, so canonical messages are
never rewritten and the abandoned branch stays readable."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """What to do with the transcript: keep its first `keep` messages (rewinding when fewer than it
    holds) and append the request's messages from index `keep` on."""

    keep: int
    rewind: bool


def reconcile(transcript: Sequence[str], request: Sequence[str]) -> Plan:
    """`transcript` and `request` are fingerprints in order."""
    limit = min(len(transcript), len(request))
    if transcript[:limit] == request[:limit]:  # the common case, compared in C
        common = limit
    else:
        common = next(index for index in range(limit) if transcript[index] != request[index])
    return Plan(keep=common, rewind=common < len(transcript))
