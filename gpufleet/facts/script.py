"""Compose many fact commands into ONE shell script with section markers, and split its output.

Each section's output is kept byte-exact, with its exit status, so that parsers on the
controller see what the command printed. Nothing a command prints can end, reopen or
forge a section, even a command that learns the run's nonce (the script is on its shell's
command line, which any process on the node can read):

- a command's output never reaches the script's output directly: it goes to a file of
  its own, and once the command is done the section is printed whole, its body in base64,
  whose alphabet holds no marker character (``@``);
- the markers carry a random nonce chosen per run on the controller;
- a section that appears twice (something on the node wrote a frame to the script's
  output itself) is not trusted: it is reported as forged, never as either copy.

A snippet that calls a tool which can hang (nvidia-smi on a GPU that fell off the bus,
timedatectl with a stuck D-Bus, df on a dead NFS mount) runs under its own deadline: it
is killed after the limit, its section ends with status 124, and later snippets of the
same tool are not started in that run. The script never waits for a process that cannot
be killed (a process stuck in the kernel): a watchdog interrupts the wait.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

TIMED_OUT = 124
FORGED = -1
"""The status of a section whose frame was printed more than once, or is not base64."""
_TOOL = re.compile(r"[A-Za-z0-9_.-]+")


def new_nonce() -> str:
    """A marker nonce for one run."""
    return secrets.token_hex(8)


def _markers(nonce: str) -> tuple[str, str]:
    tag = f"@@gpufleet-{nonce}" if nonce else "@@gpufleet"
    return f"{tag}:", f"{tag}-rc:"


def prelude(nonce: str = "") -> str:
    """The script's environment, its scratch directory (removed on exit), and the
    functions that open a section's output file (``__s``) and print the whole section
    once its command is done (``__e NAME RC``)."""
    start, end = _markers(nonce)
    return (
        "export LC_ALL=C PATH=\"$PATH:/usr/local/sbin:/usr/sbin:/sbin\"\n"
        "command -v base64 >/dev/null || { echo 'base64 (coreutils) not found' >&2; exit 127; }\n"
        "__d=$(mktemp -d \"${TMPDIR:-/tmp}/gpufleet-facts.XXXXXX\") || exit 1\n"
        "trap 'rm -rf \"$__d\"' EXIT\n"
        "__n=0\n"
        "__s() { __n=$((__n + 1)); __o=\"$__d/o.$__n\"; : >\"$__o\"; }\n"
        f"__e() {{ printf '\\n{start}%s@@\\n' \"$1\"; base64 <\"$__o\"; "
        f"printf '{end}%s@@\\n' \"$2\"; }}\n"
    )


PRELUDE = prelude()

# __g TOOL LIMIT SHELL: run SHELL under LIMIT seconds, its output to the section's file
# (a process that cannot be killed must not hold the script's stdout open). The watchdog
# interrupts `wait` (USR1 is trapped) when `timeout` itself cannot finish.
GUARD = r"""trap : USR1
__g() {
  if [ -e "$__d/h.$1" ]; then
    echo "$1 did not answer earlier in this run (timed out after $2 s); not started again"
    return 124
  fi
  timeout -k 1 "$2" sh -c "$3" </dev/null >>"$__o" 2>&1 &
  __p=$!
  (
    trap 'kill "$__w" 2>/dev/null; exit 0' TERM
    sleep $(( ${2%.*} + 2 )) & __w=$!
    wait "$__w" && { : >"$__d/t.$__p"; kill -USR1 $$; }
  ) </dev/null >/dev/null 2>&1 &
  __k=$!
  while :; do
    wait "$__p"; __r=$?
    if [ -e "$__d/t.$__p" ]; then kill -9 "$__p" 2>/dev/null; __r=124; break; fi
    kill -0 "$__p" 2>/dev/null || break
  done
  kill "$__k" 2>/dev/null
  if [ "$__r" = 124 ]; then
    : >"$__d/h.$1"
    echo "$1 timed out after $2 s"
  fi
  return "$__r"
}
"""


@dataclass(frozen=True)
class Section:
    """One command's output in the composite script."""

    name: str
    rc: int
    text: str


@dataclass(frozen=True)
class Snippet:
    """One section to compose: its shell, and the tool that may hang (None: run inline)."""

    name: str
    shell: str
    guard: str | None = None


def compose(commands: Iterable[tuple[str, str] | Snippet], nonce: str = "",
            limit_s: float = 20.0) -> str:
    """A script that runs each snippet in a subshell, stderr folded into stdout; guarded
    snippets run under ``limit_s`` seconds each."""
    snippets = [c if isinstance(c, Snippet) else Snippet(*c) for c in commands]
    parts = [prelude(nonce)]
    if any(s.guard for s in snippets):
        parts.append(GUARD)
    limit = format(max(1.0, round(limit_s, 1)), "g")
    for snippet in snippets:
        if "\n" in snippet.name or "@@" in snippet.name:
            raise ValueError(f"bad section name {snippet.name!r}")
        if snippet.guard is not None and not _TOOL.fullmatch(snippet.guard):
            raise ValueError(f"bad tool name {snippet.guard!r}")
        name = shlex.quote(snippet.name)
        if snippet.guard:
            body = f"__g {snippet.guard} {limit} {shlex.quote(snippet.shell)} >>\"$__o\"\n"
        else:
            body = f"( {snippet.shell}\n) </dev/null >\"$__o\" 2>&1\n"
        parts.append(f"__s\n{body}__e {name} $?\n")
    return "".join(parts)


def split(output: str, nonce: str = "") -> dict[str, Section]:
    """Sections by name from the composite script's output; a section printed twice, or
    whose body is not base64, has status FORGED and says so."""
    start, end = (re.escape(m) for m in _markers(nonce))
    pattern = re.compile(
        rf"\n{start}(?P<name>[^\n]*?)@@\n(?P<body>[A-Za-z0-9+/=\n]*?){end}(?P<rc>\d+)@@\n")
    sections: dict[str, Section] = {}
    seen: dict[str, int] = {}
    for match in pattern.finditer(output):
        name = match["name"]
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            sections[name] = Section(name, FORGED, f"the section appeared {seen[name]} times "
                                     "in the output (a frame printed on the node); not trusted")
            continue
        try:
            body = base64.b64decode(match["body"].replace("\n", ""), validate=True)
        except (binascii.Error, ValueError):
            sections[name] = Section(name, FORGED, "the section's body is not base64; "
                                     "not trusted")
            continue
        sections[name] = Section(name, int(match["rc"]),
                                 body.decode("utf-8", errors="replace"))
    return sections
