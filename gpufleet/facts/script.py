"""Compose many fact commands into ONE shell script with section markers, and split its output.

Each section's output is kept byte-exact between its markers, with its exit status,
so that parsers on the controller see what the command printed. The markers carry a
random nonce chosen per run, so no command output can end or forge a section.

A snippet that calls a tool which can hang (nvidia-smi on a GPU that fell off the bus,
timedatectl with a stuck D-Bus, df on a dead NFS mount) runs under its own deadline: it
is killed after the limit, its section ends with status 124, and later snippets of the
same tool are not started in that run. The script never waits for a process that cannot
be killed (a process stuck in the kernel): a watchdog interrupts the wait.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

TIMED_OUT = 124
_TOOL = re.compile(r"[A-Za-z0-9_.-]+")


def new_nonce() -> str:
    """A marker nonce for one run."""
    return secrets.token_hex(8)


def _markers(nonce: str) -> tuple[str, str]:
    tag = f"@@gpufleet-{nonce}" if nonce else "@@gpufleet"
    return f"{tag}:", f"{tag}-rc:"


def prelude(nonce: str = "") -> str:
    """Shell functions that print the start and end markers of a section."""
    start, end = _markers(nonce)
    return (
        "export LC_ALL=C PATH=\"$PATH:/usr/local/sbin:/usr/sbin:/sbin\"\n"
        f"__s() {{ printf '\\n{start}%s@@\\n' \"$1\"; }}\n"
        f"__e() {{ printf '\\n{end}%s@@\\n' \"$1\"; }}\n"
    )


PRELUDE = prelude()

# __g TOOL LIMIT SHELL: run SHELL under LIMIT seconds; its output goes to a file (a process
# that cannot be killed must not hold the script's stdout open), which is printed after.
# The watchdog interrupts `wait` (USR1 is trapped) when `timeout` itself cannot finish.
GUARD = r"""trap : USR1
__d=$(mktemp -d "${TMPDIR:-/tmp}/gpufleet-facts.XXXXXX") || exit 1
trap 'rm -rf "$__d"' EXIT
__n=0
__g() {
  if [ -e "$__d/h.$1" ]; then
    echo "$1 did not answer earlier in this run (timed out after $2 s); not started again"
    return 124
  fi
  __n=$((__n + 1))
  timeout -k 1 "$2" sh -c "$3" </dev/null >"$__d/o.$__n" 2>&1 &
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
  cat "$__d/o.$__n"
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
            body = f"__g {snippet.guard} {limit} {shlex.quote(snippet.shell)}\n"
        else:
            body = f"( {snippet.shell}\n) </dev/null 2>&1\n"
        parts.append(f"__s {name}\n{body}__e $?\n")
    return "".join(parts)


def split(output: str, nonce: str = "") -> dict[str, Section]:
    """Sections by name from the composite script's output."""
    start, end = (re.escape(m) for m in _markers(nonce))
    pattern = re.compile(
        rf"\n{start}(?P<name>[^\n]*?)@@\n(?P<body>.*?)\n{end}(?P<rc>\d+)@@\n", re.DOTALL)
    return {m["name"]: Section(m["name"], int(m["rc"]), m["body"])
            for m in pattern.finditer(output)}
