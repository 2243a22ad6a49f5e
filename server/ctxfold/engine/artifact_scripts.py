"""What a script names, for the artifact index: the files and URLs a shell command touches (each
marked by what the command does to it), the files an apply_patch patch adds, updates, deletes or
moves, and both in a script that is not a JSON object (Codex `exec`, a freeform `apply_patch`).

Paths are taken as written (relative ones too, when they have a file extension); URLs apart."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator

from ctxfold.engine.artifacts import Artifact, Kind

# fmt: off
_EXTENSIONS = frozenset((
    "py", "pyi", "pyx", "js", "jsx", "mjs", "cjs", "ts", "tsx", "go", "java", "kt", "rs", "c", "h", "cc", "cpp",
    "hpp", "cs", "rb", "php", "swift", "scala", "m", "mm", "lua", "pl", "r", "jl", "ex", "exs", "dart", "vue",
    "svelte", "md", "mdx", "rst", "txt", "json", "jsonl", "yaml", "yml", "toml", "cfg", "ini", "conf", "env", "lock",
    "sh", "bash", "zsh", "fish", "ps1", "bat", "sql", "html", "htm", "css", "scss", "less", "xml", "csv", "tsv",
    "proto", "gradle", "mk", "cmake", "dockerfile", "ipynb", "pony", "patch", "diff", "log", "tf", "hcl", "graphql",
    "gql", "svg", "png", "jpg", "jpeg", "gif", "pdf", "zip", "gz", "tar", "sqlite", "db", "pem", "crt", "key",
    "service", "plist", "mod", "sum", "csproj", "sln", "ui", "qml", "nix", "el", "vim", "zig", "nim", "hs", "ml",
    "erl", "clj", "cljs", "groovy", "yue", "moon",
))
# fmt: on
_PATHISH = re.compile(r"^(?:~|\.{1,2})?/?[\w.+@-]+(?:/[\w.+@-]+)*/?$")
_NOT_PATHS = ("/dev/", "/proc/", "/sys/")
URL = re.compile(r"https?://[^\s\"'<>)\]}`]+")
# A here-document's body is data (often a whole script), not part of the command. Linear in the text (as every
# pattern here must be: tool arguments are megabytes a caller chose): no quantifier gives back what it took,
# and the blanks before a terminator stop at the end of its line.
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w++)\1([^\n]*+)\n(.*?)(?:^[^\S\n]*\2\s*$|\Z)", re.S | re.M)
# An apply_patch patch (Codex CLI): its file headers say what happens to each file (the paths are stripped).
_PATCH_FILE = re.compile(r"^\*\*\* (Add|Update|Delete) File: (.+)$|^\*\*\* Move to: (.+)$", re.M)
_PATCH_KINDS = {"Add": Kind.WRITTEN, "Update": Kind.EDITED, "Delete": Kind.EDITED}
PATCH_BEGIN = "*** Begin Patch"
_STRING_LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"|\'((?:[^\'\\\n]|\\.)*)\'|`([^`]*)`')
# Shell programs by what they do to the paths they are given.
_WRITERS = {"touch", "mkdir", "tee", "install"}
_COPIERS = {"cp", "mv", "rsync", "ln"}
_REMOVERS = {"rm", "rmdir", "unlink"}
_IN_PLACE = {"sed", "perl"}
_SEARCHERS = {"grep", "egrep", "rg", "ag", "ack", "find", "fd", "ls", "tree", "locate", "du"}
_RUNNERS = {
    "python",
    "python3",
    "python2",
    "pytest",
    "py.test",
    "node",
    "deno",
    "bun",
    "tsx",
    "ts-node",
    "bash",
    "sh",
    "zsh",
    "ruby",
    "go",
    "cargo",
    "java",
    "php",
    "Rscript",
    "julia",
    "make",
    "npm",
    "npx",
    "uv",
    "poetry",
}
_PREFIXES = {"sudo", "time", "env", "nohup", "exec", "timeout", "xargs", "then", "do", "if", "while", "!"}
_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;", "|&"}


def without_heredoc_bodies(command: str) -> str:
    """`command` with each here-document's body left out (its `<< EOF` line kept): the body is data."""
    return _HEREDOC.sub(lambda m: f"<< {m.group(2)}{m.group(3)}\n", command)


def as_path(token: str) -> str:
    """`token` as a path, or "": absolute paths (outside /dev, /proc, /sys), `~/` paths, and relative
    ones with a file extension, as written (a leading `./` and trailing `/` dropped)."""
    token = token.strip().strip("'\"`").rstrip(".,:;")
    if token.startswith("./"):
        token = token[2:]
    if not token or "://" in token or "//" in token or not _PATHISH.match(token) or token.startswith(_NOT_PATHS):
        return ""
    if token.startswith(("/", "~/")):
        token = token.rstrip("/")
        return token if len(token) > 1 and token != "~" else ""
    stem = token.rstrip("/").rsplit("/", 1)[-1]
    extension = stem.rsplit(".", 1)[-1].lower() if "." in stem.strip(".") else ""
    return token.rstrip("/") if extension in _EXTENSIONS else ""


def word_paths(word: str) -> list[str]:
    """The paths in one shell word (`--out=a.txt`, `PATH=/a:/b` hold several)."""
    return [path for piece in re.split(r"[=:,;|&<>()\s]", word) if (path := as_path(piece))]


# shlex builds a word a character at a time, copying it at each: a word a caller made megabytes long would take
# hours. A command names its programs and paths well within this many characters.
_LEXED_CHARS = 16384


def _words(command: str) -> list[str]:
    command = command[:_LEXED_CHARS]
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes
        return command.split()


def shell_artifacts(command: str) -> Iterator[Artifact]:
    """The files and URLs a shell command names, each marked by what the command does to it:
    written (a redirect's target, `touch`, `tee`, `mkdir`, the last operand of `cp` / `mv`), edited
    (`sed -i`, `perl -i`, `rm`), run (the operands of an interpreter or test runner, or the program
    itself), searched (`grep`, `find`, `ls`, ...), read otherwise. Here-document bodies are data."""
    for url in URL.findall(command):
        yield Artifact(Kind.URL, url.rstrip(".,;"))
    command = URL.sub(" ", without_heredoc_bodies(command))
    program, previous, in_place = "", "", False
    operands: list[str] = []

    def flush() -> Iterator[Artifact]:
        if program in _COPIERS:
            for index, path in enumerate(operands):
                yield Artifact(Kind.WRITTEN if index == len(operands) - 1 else Kind.READ, path)
            return
        kind = Kind.READ
        if program in _WRITERS:
            kind = Kind.WRITTEN
        elif program in _REMOVERS or (program in _IN_PLACE and in_place):
            kind = Kind.EDITED
        elif program in _RUNNERS:
            kind = Kind.RUN
        elif program in _SEARCHERS:
            kind = Kind.SEARCHED
        for path in operands:
            yield Artifact(kind, path)

    for word in [*_words(command.replace("\n", " ; ")), ";"]:
        if word in _OPERATORS:
            yield from flush()
            program, previous, in_place, operands = "", word, False, []
            continue
        if word in (">", ">>", "<", "2>", "&>", ">|", "<<", "<<<"):
            previous = word
            continue
        if previous in (">", ">>", "&>", ">|"):
            yield from (Artifact(Kind.WRITTEN, path) for path in word_paths(word))
            previous = word
            continue
        if previous in ("<", "<<", "<<<"):
            if previous == "<":
                yield from (Artifact(Kind.READ, path) for path in word_paths(word))
            previous = word
            continue
        if not program:
            if word in _PREFIXES or re.match(r"^\w+=", word) or (previous == "timeout" and word.isdigit()):
                previous = word
                continue
            program = word.rsplit("/", 1)[-1]
            if "/" in word and (path := as_path(word)):
                yield Artifact(Kind.RUN, path)  # ./script.sh, /usr/local/bin/tool (a program run)
            previous = word
            continue
        if program in _IN_PLACE and word.startswith("-i"):
            in_place = True
        if not word.startswith("-") or "=" in word:
            operands += word_paths(word)
        previous = word


def patch_artifacts(patch: str) -> Iterator[Artifact]:
    """The files an apply_patch patch adds (written), updates or deletes (edited) or moves to (written)."""
    for verb, path, moved in _PATCH_FILE.findall(patch):
        if moved:
            yield Artifact(Kind.WRITTEN, moved.strip())
        else:
            yield Artifact(_PATCH_KINDS[verb], path.strip())


def script_artifacts(script: str) -> Iterator[Artifact]:
    """A script's files: a patch's by its headers, the rest as shell commands, line by line; in a script
    of another language (Codex `exec`) its string literals are read as the commands they often are."""
    if PATCH_BEGIN in script:
        yield from patch_artifacts(script)
        script = re.sub(r"\*\*\* Begin Patch.*?(?:\*\*\* End Patch|\Z)", " ", script, flags=re.S)
    for line in script.splitlines():
        yield from shell_artifacts(line)
    for literal in _STRING_LITERAL.findall(script):
        text = next(part for part in literal if part) if any(literal) else ""
        if " " in text.strip():
            yield from shell_artifacts(text)
