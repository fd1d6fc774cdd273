"""The one interface every host is reached through, and what SSH and local connections share.

Every command runs on the host under ``timeout`` so that a hung command is killed
there too, and within what is left of the host's budget: once a host's deadline has
passed or its run was cancelled, no further command, reconnect or reboot reaches it.
``put`` writes through a temporary file and a rename, keeping a backup. A become
password is sent only when sudo asks for it, never on a command line or into a file.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import secrets
import shlex
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host

BACKUP_SUFFIX = ".gpufleet-bak"
log = logging.getLogger("gpufleet.connect")
KILL_GRACE_S = 5
POLL_S = 0.2


T = TypeVar("T")
R = TypeVar("R")
_NODE_LOCAL: contextvars.ContextVar[bool] = contextvars.ContextVar("gpufleet_node_local",
                                                                   default=False)


@contextlib.contextmanager
def node_local() -> Iterator[None]:
    """Commands issued inside need nothing from other nodes while they run (the facts
    round trip, a node-local check): a launcher may carry such commands of many nodes in
    one dispatch."""
    token = _NODE_LOCAL.set(True)
    try:
        yield
    finally:
        _NODE_LOCAL.reset(token)


def in_node_local() -> bool:
    """Whether the current thread's commands are node-local (``node_local``)."""
    return _NODE_LOCAL.get()


def keeps_node_local(fn: Callable[[T], R]) -> Callable[[T], R]:
    """``fn`` for a worker thread: node-local there when the caller is node-local here
    (a thread does not inherit the caller's context)."""
    if not in_node_local():
        return fn

    def run(arg: T) -> R:
        with node_local():
            return fn(arg)

    return run


class Unreachable(GpufleetError):
    """The host could not be reached or the connection dropped."""


class HostCancelled(GpufleetError):
    """The host's deadline passed or its run was cancelled; nothing more is sent to it."""


class BecomeFailed(GpufleetError):
    """sudo refused the become password."""


@dataclass
class CommandResult:
    """What a command returned. ``command`` is what ran, never including secrets."""

    command: str
    rc: int
    stdout: str
    stderr: str
    duration: float

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def check(self, what: str | None = None) -> CommandResult:
        """Raise CommandFailed with the command's last error line unless it succeeded."""
        if self.rc != 0:
            detail = (self.stderr.strip() or self.stdout.strip()).splitlines()
            last = detail[-1] if detail else "no output"
            raise CommandFailed(f"{what or self.command} failed (exit {self.rc}): {last}")
        return self


class CommandTimeout(GpufleetError):
    """A command ran past its timeout and was killed; ``partial`` holds what it printed."""

    def __init__(self, message: str, partial: CommandResult) -> None:
        super().__init__(message)
        self.partial = partial


class CommandFailed(GpufleetError):
    """A command that had to succeed returned a non-zero exit status."""


class Budget:
    """One host's time budget and cancellation, shared by every connection to the host.

    ``start`` sets the deadline; ``cancel`` closes every connection attached to the
    budget, and from then on (or once the deadline has passed) ``admit`` refuses any
    further command, connect or reconnect. A task may set ``progress`` to the value it
    has built so far, which the report keeps if the host is cut off.
    """

    def __init__(self, limit_s: float | None = None) -> None:
        self.limit_s = limit_s
        self.deadline: float | None = None
        self.reason: str | None = None
        self.progress: Any = None
        self._conns: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._lock = threading.Lock()
        if limit_s is not None:
            self.start(limit_s)

    def start(self, limit_s: float | None) -> None:
        """Begin counting: the host has ``limit_s`` seconds from now (None: no limit)."""
        self.limit_s = limit_s
        self.deadline = None if limit_s is None else time.monotonic() + limit_s

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None without a deadline)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    @property
    def cancelled(self) -> bool:
        return self.reason is not None

    @property
    def spent(self) -> bool:
        """Cancelled, or past the deadline."""
        left = self.remaining()
        return self.cancelled or (left is not None and left <= 0)

    def attach(self, conn: Connection) -> None:
        with self._lock:
            self._conns.add(conn)

    def cancel(self, reason: str) -> None:
        """Stop the host's work: close its connections; later commands are refused."""
        with self._lock:
            if self.reason is None:
                self.reason = reason
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()

    def admit(self, what: str) -> None:
        """Raise HostCancelled unless the host may still be sent ``what``."""
        if self.reason is not None:
            raise HostCancelled(f"{self.reason}; not sent: {what}")
        left = self.remaining()
        if left is not None and left <= 0:
            raise HostCancelled(f"host deadline of {self.limit_s:g}s reached; not sent: {what}")

    def clip(self, timeout: float) -> tuple[float, bool]:
        """``timeout`` bounded by what is left; and whether the budget was the bound."""
        left = self.remaining()
        if left is not None and left < timeout:
            return max(0.1, left), True
        return timeout, False


@dataclass
class ConnectOptions:
    """How to connect: timeouts and host key trust."""

    connect_timeout: float = 10.0
    accept_new_host_keys: bool = False
    expect_fingerprint: str | None = None
    known_hosts_base: Path = field(default_factory=Path.cwd)


class Connection(Protocol):
    """What roles, facts and suites use to act on one host."""

    host: Host
    round_trips: int
    budget: Budget

    def run(self, command: str, *, timeout: float = 120.0, stdin: bytes | None = None,
            become: bool | None = None) -> CommandResult: ...

    def put(self, path: str, content: bytes, *, mode: int = 0o644, owner: str = "root:root",
            backup: bool = True) -> None: ...

    def reopen(self) -> Connection: ...

    def close(self) -> None: ...


def wrap_command(command: str, timeout: float, sudo: list[str]) -> str:
    """The remote command line: optional sudo, then coreutils timeout around ``sh -c``."""
    limit = format(max(0.1, round(timeout, 1)), "g")
    return shlex.join([*sudo, "timeout", "-k", str(KILL_GRACE_S), limit, "sh", "-c", command])


def put_script(path: str, mode: int, owner: str, backup: bool) -> str:
    """Shell that writes stdin to ``path`` atomically: temp file, fsync, backup, rename."""
    p = shlex.quote(path)
    lines = [
        "set -e",
        f"mkdir -p \"$(dirname {p})\"",
        f"t=$(mktemp {shlex.quote(path + '.gpufleet-tmp.')}XXXXXX)",
        "trap 'rm -f \"$t\"' EXIT",
        "cat > \"$t\"",
        f"chmod {mode:o} \"$t\"",
        f"chown {shlex.quote(owner)} \"$t\"",
        "sync \"$t\" 2>/dev/null || true",
    ]
    if backup:
        lines.append(f"if [ -f {p} ]; then cp -p {p} {shlex.quote(path + BACKUP_SUFFIX)}; fi")
    lines.append(f"mv -f \"$t\" {p}")
    return "\n".join(lines)


@dataclass(frozen=True)
class _Become:
    """sudo with a password: the prompt sudo prints, and the line printed once it let the
    command start. Both carry a nonce; the password itself never appears in the command."""

    password: bytes
    prompt: bytes
    ready: bytes


def become_prefix(user: str, password: str | None) -> tuple[list[str], _Become | None]:
    """The sudo words before the command, and what the conversation needs (with a password).

    Without a password sudo must not ask (``-n``). With one, sudo reads it from stdin
    only when it prompts; the command's own stdin is sent after the ready line.
    """
    if password is None:
        return ["sudo", "-n", "-H", "-u", user, "--"], None
    nonce = secrets.token_hex(8)
    prompt, ready = f"[gpufleet-sudo-{nonce}]", f"@@gpufleet-become-{nonce}@@"
    start = f"printf '%s\\n' {shlex.quote(ready)} >&2; exec \"$@\""
    return (["sudo", "-S", "-p", prompt, "-H", "-u", user, "--", "sh", "-c", start, "sh"],
            _Become(password.encode() + b"\n", prompt.encode(), ready.encode() + b"\n"))


class Stream(Protocol):
    """One running command: its stdin, both output streams and its exit status."""

    def send(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...
    def poll(self, wait: float) -> tuple[bytes, bytes]: ...
    def finished(self) -> bool: ...
    def status(self) -> int: ...
    def lost(self) -> str | None: ...
    def stop(self) -> None: ...


def _converse(stream: Stream, stdin: bytes, become: _Become | None, limit: float,
              host: str) -> tuple[int, bytes, bytes]:
    """Drive one command to its end within ``limit`` seconds (124 when it ran past it).

    With ``become``, stdin is held back while sudo may still read: the password is sent
    once, when sudo prompts, and the command's stdin once sudo has started it.
    """
    deadline = time.monotonic() + limit
    out, err = bytearray(), bytearray()
    holding = become is not None
    prompts = 0
    if not holding:
        _feed(stream, stdin)
    while not stream.finished():
        if time.monotonic() > deadline:
            return 124, bytes(out), bytes(err)
        chunk, echunk = stream.poll(POLL_S)
        out += chunk
        err += echunk
        if become is not None and holding:
            while become.prompt in err:
                del err[err.index(become.prompt):err.index(become.prompt) + len(become.prompt)]
                prompts += 1
                if prompts > 1:
                    stream.stop()
                    raise BecomeFailed(f"sudo on {host} rejected the become password "
                                       "(ansible_become_password)")
                stream.send(become.password)
            if become.ready in err:
                at = err.index(become.ready)
                del err[at:at + len(become.ready)]
                holding = False
                _feed(stream, stdin)
        why = stream.lost()
        if why:
            raise Unreachable(why)
    return stream.status(), bytes(out), bytes(err)


def _feed(stream: Stream, data: bytes) -> None:
    if data:
        stream.send(data)
    stream.close_stdin()


class CommandRunner:
    """Shared run/put behaviour; subclasses provide ``_stream`` and ``reopen``."""

    host: Host
    round_trips: int
    budget: Budget

    def _stream(self, line: str) -> Stream:
        raise NotImplementedError

    def _become(self, become: bool | None) -> tuple[list[str], _Become | None]:
        wanted = self.host.become if become is None else become
        if not wanted:
            return [], None
        password = self.host.vars.get("ansible_become_password") or self.host.vars.get(
            "ansible_become_pass")
        return become_prefix(self.host.become_user, str(password) if password else None)

    def run(self, command: str, *, timeout: float = 120.0, stdin: bytes | None = None,
            become: bool | None = None) -> CommandResult:
        """Run ``command`` with sh on the host; a hung command is killed after ``timeout``
        (or at the host's deadline, whichever comes first)."""
        self.budget.admit(_short(command))
        limit, clipped = self.budget.clip(timeout)
        sudo, secret = self._become(become)
        start = time.monotonic()
        self.round_trips += 1
        stream = self._stream(wrap_command(command, limit, sudo))
        try:
            rc, out, err = _converse(stream, stdin or b"", secret, limit + KILL_GRACE_S + 5,
                                     self.host.name)
        except Unreachable:
            if self.budget.cancelled:
                raise HostCancelled(f"{self.budget.reason}; stopped: {_short(command)}"
                                    ) from None
            raise
        finally:
            stream.stop()
        if self.budget.cancelled:
            raise HostCancelled(f"{self.budget.reason}; stopped: {_short(command)}")
        duration = time.monotonic() - start
        result = CommandResult(command, rc, _text(out), _text(err), duration)
        log.info("%s: %s -> exit %d in %.2fs", self.host.name, _short(command, 160), rc,
                 duration)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: stdout:\n%s", self.host.name, _tail(result.stdout))
            log.debug("%s: stderr:\n%s", self.host.name, _tail(result.stderr))
        if rc == 124 or (rc == 137 and duration >= limit):
            if clipped:
                self.budget.cancel(f"host timed out after {self.budget.limit_s:g}s")
                raise CommandTimeout(f"stopped at the host's deadline: {_short(command)}",
                                     result)
            raise CommandTimeout(f"command timed out after {timeout:.0f}s: {_short(command)}",
                                 result)
        return result

    def put(self, path: str, content: bytes, *, mode: int = 0o644, owner: str = "root:root",
            backup: bool = True) -> None:
        """Write ``content`` to ``path`` atomically, keeping the previous file as a backup."""
        log.info("%s: put %s (%d bytes, mode %o)", self.host.name, path, len(content), mode)
        self.run(put_script(path, mode, owner, backup), stdin=content).check(f"writing {path}")


def _tail(text: str, limit: int = 4000) -> str:
    """The end of a command's output, for a debug log line."""
    return text if len(text) <= limit else f"... ({len(text) - limit} characters) " + \
        text[-limit:]


def _short(command: str, limit: int = 80) -> str:
    first = command.strip().splitlines()[0] if command.strip() else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")



Connector = Callable[[Host, ConnectOptions, Budget], Connection]
"""How a run reaches a host: ``connect`` (SSH or local), or the srun launcher's."""


