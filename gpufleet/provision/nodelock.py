"""One run at a time changes a node: a lock held on the node itself, so two controllers (or
the nightly ``--remediate`` and an operator's ``provision``) never interleave apt runs and
file writes.

The lock is a directory, ``/run/gpufleet/lock``, made atomically with ``mkdir``; its
``holder`` file names the run (command, controller, process, start) and the holder's
deadline. A lock past its holder's deadline is stale (the holder was killed, its host
budget is spent) and is taken over. A run that finds the lock held waits for it within its
``--lock-timeout``, then fails that host naming the holder. The holder removes the lock on
every path out of the apply, and only its own (the token in the file is checked). A reboot
empties /run, so a node never stays locked across one.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import socket
import time
from dataclasses import dataclass
from typing import NamedTuple

from gpufleet.connect.connection import Connection
from gpufleet.errors import GpufleetError

LOCK = "/run/gpufleet/lock"
POLL_S = 2.0
DEFAULT_HOLD_S = 7200.0
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")  # a line break would end the holder's line

_ACQUIRE = r"""
l={lock}; now=$(date +%s)
mkdir -p "${{l%/*}}" && chmod 700 "${{l%/*}}" || exit 3
take() {{
  mkdir "$l" 2>/dev/null || return 1
  cat > "$l/holder.new" && mv "$l/holder.new" "$l/holder"
}}
if take; then echo ACQUIRED; exit 0; fi
until=$(sed -n 's/^until=//p' "$l/holder" 2>/dev/null)
case "$until" in ''|*[!0-9]*) ;; *)
  if [ "$now" -gt "$until" ]; then
    mv "$l" "$l.stale.$$" 2>/dev/null && rm -rf "$l.stale.$$"
    if take; then echo ACQUIRED-STALE; exit 0; fi
  fi;;
esac
echo HELD; cat "$l/holder" 2>/dev/null; exit 0
"""
_RELEASE = ("l={lock}; [ \"$(sed -n 's/^token=//p' \"$l/holder\" 2>/dev/null)\" = {token} ] "
            "&& rm -rf \"$l\"; exit 0")


class NodeLocked(GpufleetError):
    """Another run holds the node's lock past this run's wait."""


@dataclass(frozen=True)
class Holder:
    """Who holds a node's lock, and until when (Unix time)."""

    command: str
    controller: str
    pid: int
    started: float
    until: float
    token: str

    @classmethod
    def this_run(cls, command: str, hold_s: float | None) -> Holder:
        now = time.time()
        return cls(command, socket.gethostname(), os.getpid(), now,
                   now + (hold_s if hold_s is not None else DEFAULT_HOLD_S),
                   secrets.token_hex(16))

    def text(self) -> str:
        return "".join(f"{key}={_UNSAFE.sub('_', str(value))}\n" for key, value in (
            ("command", self.command), ("controller", self.controller), ("pid", self.pid),
            ("started", int(self.started)), ("until", int(self.until)),
            ("token", self.token)))


def describe(holder_text: str) -> str:
    """The holder as a person reads it, from its file."""
    fields = dict(line.split("=", 1) for line in holder_text.splitlines() if "=" in line)
    if "command" not in fields:
        return "another run (its details are being written)"

    def stamp(key: str) -> str:
        value = fields.get(key, "")
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(value))) \
            if value.isdigit() else "?"

    return (f"{fields['command']} from {fields.get('controller', '?')} (pid "
            f"{fields.get('pid', '?')}) since {stamp('started')}, until {stamp('until')}")


class Acquired(NamedTuple):
    """The lock is this run's: how it was taken, and whether another run held it first
    (the node may have changed meanwhile)."""

    note: str
    waited: bool = False


def acquire(conn: Connection, holder: Holder, wait_s: float) -> Acquired:
    """Take the node's lock for ``holder``, waiting up to ``wait_s`` for another run's."""
    script = _ACQUIRE.format(lock=shlex.quote(LOCK))
    start = time.monotonic()
    end = start + wait_s
    held_by: str | None = None
    while True:
        result = conn.run(script, timeout=30, stdin=holder.text().encode())
        result.check(f"taking the node lock {LOCK}")
        first, _, rest = result.stdout.partition("\n")
        if first == "ACQUIRED" and held_by is None:
            return Acquired("acquired")
        if first == "ACQUIRED":
            return Acquired(f"acquired after waiting {time.monotonic() - start:.0f}s for "
                            f"{held_by}", waited=True)
        if first == "ACQUIRED-STALE":
            return Acquired("acquired (a stale lock, past its holder's deadline, was taken "
                            "over)", waited=held_by is not None)
        held_by = describe(rest)
        left = end - time.monotonic()
        if left <= 0:
            raise NodeLocked(f"the node is being changed by {held_by}; waited "
                             f"{wait_s:g}s (--lock-timeout), not changed")
        time.sleep(min(POLL_S, left))


def release(conn: Connection, holder: Holder) -> None:
    """Remove the node's lock if it is still ``holder``'s."""
    conn.run(_RELEASE.format(lock=shlex.quote(LOCK), token=holder.token), timeout=30)
