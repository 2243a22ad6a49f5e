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
    "erl", "clj", "cljs", "groovy", "yue", "moon", "pm",
))
# Files known by a name without an extension.
_NAMES = frozenset((
    "Makefile", "makefile", "GNUmakefile", "Dockerfile", "Containerfile", "Justfile", "justfile", "Gemfile",
    "Rakefile", "Procfile", "Jenkinsfile", "Vagrantfile", "Brewfile", "Pipfile", "README", "LICENSE", "COPYING",
    "NOTICE", "CHANGELOG", "AUTHORS", "CODEOWNERS", "VERSION",
))
# fmt: on
_PATHISH = re.compile(r"^(?:~|\.{1,2})?/?[\w.+@-]+(?:/[\w.+@-]+)*/?$")
# A quoted word's path: spaces and apostrophes are the name's.
_SPACED_PATH = re.compile(r"^(?:~|\.{1,2})?/?[\w.+@' -]+(?:/[\w.+@' -]+)*/?$")
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
_SHELLS = {"bash", "sh", "zsh", "dash", "ksh"}
_INTERPRETERS = {"python", "python3", "python2", "node", "deno", "bun", "ruby", "perl"}
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
_REDIRECTS = {">", ">>", "<", "2>", "&>", ">|", "<<", "<<<"}
# Programs whose operands are files whatever their names: a quoted operand with spaces is one file.
_READERS = {"cat", "less", "more", "head", "tail", "wc", "diff", "vim", "vi", "nano", "code", "source", "stat", "bat"}
_FILE_PROGRAMS = _WRITERS | _COPIERS | _REMOVERS | _IN_PLACE | _READERS
# Files a program's source opens by a literal: Python's open() (and its mode) and pathlib, Node's fs.
_OPENED = re.compile(
    r"""\bopen\(\s*['"]([^'"\n]++)['"](?:\s*,\s*(?:mode\s*=\s*)?['"]([^'"\n]*+)['"])?"""
    r"""|\bPath\(\s*['"]([^'"\n]++)['"]\s*\)\.(write_text|write_bytes|touch|read_text|read_bytes|open)\b"""
    r"""|\bfs\.(?:promises\.)?(read|write|append)File(?:Sync)?\(\s*['"]([^'"\n]++)['"]"""
)
# A unified diff's file headers (`--- a/x`, then `+++ b/x`; a timestamp after a tab).
_DIFF_FILES = re.compile(r"^--- ([^\t\n]++)[^\n]*+\n\+\+\+ ([^\t\n]++)", re.M)


def without_heredoc_bodies(command: str) -> str:
    """`command` with each here-document's body left out (its `<< EOF` line kept): the body is data."""
    return _HEREDOC.sub(lambda m: f"<< {m.group(2)}{m.group(3)}\n", command)


def as_path(token: str, named: bool = False) -> str:
    """`token` as a path, or "": absolute paths (outside /dev, /proc, /sys), `~/` paths, and relative
    ones with a file extension, a well-known name (`Makefile`) or a dotfile's, as written (a leading `./`
    and trailing `/` dropped). `named`: the token stands where a command takes a file (a redirect's
    target, `cat`'s operand), so any relative name with a letter is one, and a quoted one may hold spaces."""
    token = token.strip().strip("'\"`").rstrip(".,:;")
    if token.startswith("./"):
        token = token[2:]
    pattern = _SPACED_PATH if named else _PATHISH
    if not token or "://" in token or "//" in token or not pattern.match(token) or token.startswith(_NOT_PATHS):
        return ""
    if token.startswith(("/", "~/")):
        token = token.rstrip("/")
        return token if len(token) > 1 and token != "~" else ""
    stem = token.rstrip("/").rsplit("/", 1)[-1]
    extension = stem.rsplit(".", 1)[-1].lower() if "." in stem.strip(".") else ""
    known = extension in _EXTENSIONS or stem in _NAMES or re.match(r"\.[A-Za-z]", stem) is not None
    return token.rstrip("/") if known or (named and re.search(r"[A-Za-z]", stem)) else ""


def word_paths(word: str) -> list[str]:
    """The paths in one shell word (`--out=a.txt`, `PATH=/a:/b` hold several)."""
    return [path for piece in re.split(r"[=:,;|&<>()\s]", word) if (path := as_path(piece))]


def named_paths(word: str) -> list[str]:
    """The paths in a word standing where a command takes a file: the word itself when it is one (spaces
    and all: the shell's quotes made it one word), else those `word_paths` finds in it."""
    path = as_path(word, named=True)
    return [path] if path else word_paths(word)


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


def code_artifacts(code: str) -> Iterator[Artifact]:
    """The files a program's source opens by a literal path (Python's `open` and `pathlib`, Node's `fs`):
    written when it opens them to write, read otherwise."""
    for opened, mode, pathlib, method, verb, node_path in _OPENED.findall(code):
        path = as_path(opened or pathlib or node_path, named=True)
        writes = re.search(r"[wax+]", mode) or method.startswith(("write", "touch")) or verb in ("write", "append")
        if path:
            yield Artifact(Kind.WRITTEN if writes else Kind.READ, path)


def diff_artifacts(text: str) -> Iterator[Artifact]:
    """The files a unified diff in `text` changes: created (written), changed or deleted (edited)."""
    for old_header, new_header in _DIFF_FILES.findall(text):
        old, new = old_header.strip().removeprefix("a/"), new_header.strip().removeprefix("b/")
        if new == "/dev/null":
            kind, path = Kind.EDITED, as_path(old, named=True)
        else:
            kind, path = Kind.WRITTEN if old == "/dev/null" else Kind.EDITED, as_path(new, named=True)
        if path:
            yield Artifact(kind, path)


def _heredoc_scripts(command: str, depth: int) -> Iterator[Artifact]:
    """The files named by here-documents that are programs: a shell's (`bash <<EOF`) or an
    interpreter's (`python3 - <<EOF`), read for the files they open; any other's body is data."""
    for match in _HEREDOC.finditer(command):
        line = command[command.rfind("\n", 0, match.start()) + 1 : match.start()]
        words = re.split(r"[;&|()]", line)[-1].split()
        program = words[0].rsplit("/", 1)[-1] if words else ""
        if program in _SHELLS:
            yield from shell_artifacts(match.group(4), depth + 1)
        elif program in _INTERPRETERS:
            yield from code_artifacts(match.group(4))


# Scripts in scripts (`bash -c "bash -c '...'"`, a here-document's shell) are read this many levels deep.
_NESTED = 3


def shell_artifacts(command: str, depth: int = 0) -> Iterator[Artifact]:
    """The files and URLs a shell command names, each marked by what the command does to it:
    written (a redirect's target, `touch`, `tee`, `mkdir`, the last operand of `cp` / `mv` / `git mv`),
    edited (`sed -i`, `perl -pi`, `rm`, `git rm`), run (the operands of an interpreter or test runner, or
    the program itself), searched (`grep`, `find`, `ls`, ...), read otherwise. A shell's `-c` script is
    a command of its own, an interpreter's `-c` code is read for the files it opens, and so are the
    here-documents such programs read; other here-documents' bodies are data, unified diffs aside."""
    for url in URL.findall(command):
        yield Artifact(Kind.URL, url.rstrip(".,;"))
    yield from diff_artifacts(command)
    if depth < _NESTED:
        yield from _heredoc_scripts(command, depth)
    words = _Command(depth)
    for word in [*_words(URL.sub(" ", without_heredoc_bodies(command)).replace("\n", " ; ")), ";"]:
        if word in _OPERATORS:
            yield from words.flush()
            words = _Command(depth)
        else:
            yield from words.take(word)


class _Command:
    """One shell command's words, taken one at a time: its program, options and operands."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.program, self.previous, self.in_place, self.script_seen, self.arguments = "", "", False, False, 0
        self.operands: list[str] = []

    def flush(self) -> Iterator[Artifact]:
        if self.program in _COPIERS:
            for index, path in enumerate(self.operands):
                yield Artifact(Kind.WRITTEN if index == len(self.operands) - 1 else Kind.READ, path)
            return
        kind = Kind.READ
        if self.program in _WRITERS:
            kind = Kind.WRITTEN
        elif self.program in _REMOVERS or (self.program in _IN_PLACE and self.in_place):
            kind = Kind.EDITED
        elif self.program in _RUNNERS:
            kind = Kind.RUN
        elif self.program in _SEARCHERS:
            kind = Kind.SEARCHED
        for path in self.operands:
            yield Artifact(kind, path)

    def take(self, word: str) -> Iterator[Artifact]:
        previous, self.previous = self.previous, word
        if word in _REDIRECTS:
            pass
        elif previous in (">", ">>", "&>", ">|"):
            yield from (Artifact(Kind.WRITTEN, path) for path in named_paths(word))
        elif previous in ("<", "<<", "<<<"):
            yield from (Artifact(Kind.READ, path) for path in named_paths(word) if previous == "<")
        elif not self.program:
            if word in _PREFIXES or re.match(r"^\w+=", word) or (previous == "timeout" and word.isdigit()):
                return
            self.program = word.rsplit("/", 1)[-1]
            if "/" in word and (path := as_path(word)):
                yield Artifact(Kind.RUN, path)  # ./script.sh, /usr/local/bin/tool (a program run)
        else:
            yield from self._argument(word, previous)

    def _argument(self, word: str, previous: str) -> Iterator[Artifact]:
        program, option = self.program, re.match(r"-[A-Za-z]+$", previous) is not None
        if program in _SHELLS and option and previous.endswith("c"):
            yield from shell_artifacts(word, self.depth + 1) if self.depth < _NESTED else ()  # bash -lc '...'
        elif program in _INTERPRETERS and option and previous.endswith(("c", "e")):
            yield from code_artifacts(word)  # python -c '...', node -e '...'
        elif program in _IN_PLACE and (word == "-e" or (option and previous.endswith("e"))):
            self.script_seen = True  # sed -e SCRIPT, perl -pi -e CODE: a script, no file
        elif program in _IN_PLACE and re.match(r"-[A-Za-z]*i|--in-place", word):
            self.in_place = True
        elif word.startswith("-") and "=" not in word:
            pass
        elif program == "git" and word in ("mv", "rm") and not self.arguments:
            self.program = word  # git mv, git rm: their operands are files as mv's and rm's are
        elif program == "sed" and not self.script_seen:
            self.script_seen = bool(word)  # its first operand is its script (`sed -i '' ...`: '' is none)
        else:
            self.operands += named_paths(word) if program in _FILE_PROGRAMS else word_paths(word)
        self.arguments += not word.startswith("-")


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
