"""The artifact index as a summary lists it: merged across folds (a file keeps every way it was
touched, the most recently touched first), fitted to its budget, and rendered — files grouped by
directory (a long shared prefix written once), then tasks, errors, URLs and commands. It never reads
summary text: the index is carried from checkpoint to checkpoint as data."""

from __future__ import annotations

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


def _roots(directories: Sequence[str]) -> dict[str, str]:
    """Each directory's root (or none): prefixes chosen greedily by the characters writing them once
    saves, the longest of equal savings first."""
    candidates: dict[str, list[str]] = {}
    for directory in directories:
        parts = directory.split("/")
        for depth in range(1, len(parts)):
            prefix = "/".join(parts[:depth]) + "/"
            if len(prefix) >= ROOT_MIN_CHARS:
                candidates.setdefault(prefix, []).append(directory)
    root_of: dict[str, str] = {}
    while candidates:
        saved = {p: (len(ds) - 1) * len(p) - 4 for p, ds in candidates.items()}
        best = max(candidates, key=lambda p: (saved[p], len(p)))
        if saved[best] < _ROOT_MIN_SAVED:
            break
        for directory in candidates.pop(best):
            root_of[directory] = best
        candidates = {p: [d for d in ds if d not in root_of] for p, ds in candidates.items()}
        candidates = {p: ds for p, ds in candidates.items() if ds}
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
    lines: list[str] = []
    listed: set[str] = set()
    for directory, names in by_directory.items():
        root = root_of.get(directory)
        if root is None:
            lines.append(f"{directory}: {', '.join(names)}")
        elif root not in listed:
            listed.add(root)
            lines.append(f"{root}:")
            for member in (d for d in by_directory if root_of.get(d) == root):
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
