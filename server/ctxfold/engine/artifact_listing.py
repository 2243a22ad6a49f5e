"""The artifact index as a summary lists it: merged across folds (a file keeps every way it was
touched, the most recently touched first), fitted to its budget, and rendered — files grouped by
directory (a long shared prefix written once), then tasks, errors, URLs and commands. It never reads
summary text: the index is carried from checkpoint to checkpoint as data."""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Sequence

from ctxfold.engine import estimator
from ctxfold.engine.artifacts import FILE_KINDS, FILES_LEGEND, MARKS, Artifact, Budget, Kind

_LABELS = {
    Kind.TASK: "Background tasks / subagents",
    Kind.ERROR: "Errors seen",
    Kind.URL: "URLs",
    Kind.COMMAND: "Commands (exit status)",
}

_STRENGTH = {kind: index for index, kind in enumerate(FILE_KINDS)}


def _joined(a: Artifact, b: Artifact) -> Artifact:
    """Two records of one file: every mark of both, the newest value's spelling."""
    marks = a.touched | b.touched
    return Artifact(min(marks, key=_STRENGTH.__getitem__), a.value, marks=marks if len(marks) > 1 else frozenset())


def merge(previous: Sequence[Artifact], new: Sequence[Artifact]) -> list[Artifact]:
    """`previous` (most recent first) updated with `new` (oldest first): deduplicated, the most
    recently touched first; a file keeps every way it was touched, a command its newest exit status."""
    merged: dict[tuple[str, str], Artifact] = {a.key: a for a in reversed(previous)}
    for artifact in new:
        known = merged.pop(artifact.key, None)
        is_file = artifact.kind in FILE_KINDS
        merged[artifact.key] = _joined(artifact, known) if is_file and known is not None else artifact
    return list(reversed(merged.values()))


def _directory(path: str) -> tuple[str, str]:
    """(directory with its trailing slash, name): `./` for a bare relative name."""
    head, _, name = path.rpartition("/")
    if not head and not path.startswith("/"):
        return "./", name
    return head + "/", name


# A directory prefix is written once (as a root the directories below it are listed under) when it
# is at least this long and saves at least this many characters.
ROOT_MIN_CHARS = 12
_ROOT_MIN_SAVED = 24


def _shared_length(a: str, b: str) -> int:
    """The length of the longest common prefix of `a` and `b` (found by halving: each comparison runs in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _roots(directories: Sequence[str]) -> dict[str, str]:
    """Each directory's root (or none): prefixes chosen greedily by the characters writing them once
    saves, the longest of equal savings first, then the first seen.

    Only a longest prefix shared by a set of directories can be chosen (a shorter one of the same set saves
    less), and each is a common prefix of two neighbours in sorted order, cut at a slash: so the candidates
    are found in one pass, and a choice updates the others' counts through a Fenwick tree of chosen
    directories. Time and memory grow with the directories' characters, not with their count squared or
    (prefixes of prefixes) a long one's length squared."""
    by_text = sorted(range(len(directories)), key=directories.__getitem__)
    ordered = [directories[i] for i in by_text]
    shared = {a[: a.rfind("/", 0, _shared_length(a, b)) + 1] for a, b in itertools.pairwise(ordered)}
    chosen = [0] * (len(ordered) + 1)  # a Fenwick tree: how many of the first n (sorted) have a root

    def rooted_before(end: int) -> int:
        total = 0
        while end > 0:
            total, end = total + chosen[end], end & (end - 1)
        return total

    def saved(prefix: str, low: int, high: int) -> int:
        return (high - low - rooted_before(high) + rooted_before(low) - 1) * len(prefix) - 4

    heap = []
    for prefix in shared:
        if len(prefix) >= ROOT_MIN_CHARS:
            low = bisect.bisect_left(ordered, prefix)
            high = bisect.bisect_left(ordered, True, low, key=lambda d: not d.startswith(prefix))
            first = min(by_text[low:high])
            heap.append((-saved(prefix, low, high), -len(prefix), first, prefix, low, high))
    heapq.heapify(heap)
    root_of: dict[str, str] = {}
    while heap:
        stale, _, first, prefix, low, high = heapq.heappop(heap)
        now = saved(prefix, low, high)
        if -stale != now:  # directories of it were rooted since: a smaller saving, in its place
            heapq.heappush(heap, (-now, -len(prefix), first, prefix, low, high))
            continue
        if now < _ROOT_MIN_SAVED:
            break
        for position in range(low, high):
            if ordered[position] not in root_of:
                root_of[ordered[position]] = prefix
                node = position + 1
                while node <= len(ordered):
                    chosen[node] += 1
                    node += node & -node
    return root_of


def render_files(files: Sequence[Artifact]) -> list[str]:
    """One line per directory, `dir/: name MARKS, name`, the most recently touched first; directories
    sharing a long prefix are listed under it, relative (`root/:` then `  rel/: names`, `./` for the
    root itself)."""
    by_directory: dict[str, list[str]] = {}
    for artifact in files:
        directory, name = _directory(artifact.value)
        marks = "".join(MARKS[k] for k in FILE_KINDS if k in artifact.touched and k is not Kind.READ)
        by_directory.setdefault(directory, []).append(f"{name} {marks}" if marks else name)
    root_of = _roots(list(by_directory))
    members: dict[str, list[str]] = {}  # a root's directories, listed (and taken out) where its first one is
    for directory in by_directory:
        if directory in root_of:
            members.setdefault(root_of[directory], []).append(directory)
    lines: list[str] = []
    for directory, names in by_directory.items():
        root = root_of.get(directory)
        if root is None:
            lines.append(f"{directory}: {', '.join(names)}")
        elif root in members:
            lines.append(f"{root}:")
            for member in members.pop(root):
                relative = member[len(root) :] or "./"
                lines.append(f"  {relative}: {', '.join(by_directory[member])}")
    return lines


def render(artifacts: Sequence[Artifact]) -> str:
    files = [a for a in artifacts if a.kind in FILE_KINDS]
    lines = [FILES_LEGEND + ":", *render_files(files)] if files else []
    for kind in (Kind.TASK, Kind.ERROR, Kind.URL, Kind.COMMAND):
        items = [a for a in artifacts if a.kind is kind]
        if not items:
            continue
        if kind is Kind.COMMAND:
            body = "; ".join(f"`{a.value}`" + (f" → {a.detail}" if a.detail else "") for a in items)
        elif kind is Kind.ERROR:
            body = " | ".join(a.value for a in items)
        else:
            body = ", ".join(a.value for a in items)
        lines.append(f"{_LABELS[kind]}: {body}")
    return "\n".join(lines)


def _fitting(artifacts: Sequence[Artifact], limit: int, rank: dict[Kind, int]) -> set[int]:
    """Indexes of `artifacts` whose rendering fits `limit` tokens, the least recent of the lowest
    rank dropped first."""
    ranked = sorted(range(len(artifacts)), key=lambda i: (rank[artifacts[i].kind], i))
    keep = len(ranked)
    while keep and estimator.count_text(render([artifacts[i] for i in sorted(ranked[:keep])])) > limit:
        keep = keep - max(1, (keep - 1) // 8)
    return set(ranked[:keep])


def within_budget(artifacts: Sequence[Artifact], limits: Budget) -> tuple[list[Artifact], list[Artifact]]:
    """(kept, evicted): the files whose listing fits `limits.files`, the least recent dropped first,
    and the other artifacts that fit `limits.others`, commands leaving first, then URLs, errors,
    tasks."""
    files = [i for i, a in enumerate(artifacts) if a.kind in FILE_KINDS]
    others = [i for i, a in enumerate(artifacts) if a.kind not in FILE_KINDS]
    order = [kind for kind in Kind if kind not in FILE_KINDS]
    rank = {kind: 0 if kind in FILE_KINDS else order.index(kind) for kind in Kind}
    kept = {files[i] for i in _fitting([artifacts[i] for i in files], limits.files, rank)}
    kept |= {others[i] for i in _fitting([artifacts[i] for i in others], limits.others, rank)}
    return (
        [a for i, a in enumerate(artifacts) if i in kept],
        [a for i, a in enumerate(artifacts) if i not in kept],
    )


def counts(artifacts: Sequence[Artifact]) -> dict[str, int]:
    """How many of each category `artifacts` holds (paths, commands, URLs, errors, tasks)."""
    found: dict[str, int] = {}
    for artifact in artifacts:
        found[artifact.category] = found.get(artifact.category, 0) + 1
    return found
