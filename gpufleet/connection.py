"""Connections to hosts: SSH (Fabric/paramiko) and local, with one shared interface.

Every command runs on the host under ``timeout`` so that a hung command is killed
there too, and within what is left of the host's budget: once a host's deadline has
passed or its run was cancelled, no further command, reconnect or reboot reaches it.
``put`` writes through a temporary file and a rename, keeping a backup. A become
password is sent only when sudo asks for it, never on a command line or into a file.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import secrets
import selectors
import shlex
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

import fabric
import paramiko

from gpufleet.errors import GpufleetError
from gpufleet.hostkeys import (
    HostKeyError,
    VerifyPolicy,
    changed_key_message,
    fingerprint,
    known_hosts_name,
    trust_known,
)
from gpufleet.inventory import Host, parse_jump, ssh_option

BACKUP_SUFFIX = ".gpufleet-bak"
KILL_GRACE_S = 5
POLL_S = 0.2
_R = TypeVar("_R")


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


class _Stream(Protocol):
    """One running command: its stdin, both output streams and its exit status."""

    def send(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...
    def poll(self, wait: float) -> tuple[bytes, bytes]: ...
    def finished(self) -> bool: ...
    def status(self) -> int: ...
    def lost(self) -> str | None: ...
    def stop(self) -> None: ...


def _converse(stream: _Stream, stdin: bytes, become: _Become | None, limit: float,
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


def _feed(stream: _Stream, data: bytes) -> None:
    if data:
        stream.send(data)
    stream.close_stdin()


class CommandRunner:
    """Shared run/put behaviour; subclasses provide ``_stream`` and ``reopen``."""

    host: Host
    round_trips: int
    budget: Budget

    def _stream(self, line: str) -> _Stream:
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
        self.run(put_script(path, mode, owner, backup), stdin=content).check(f"writing {path}")


def _short(command: str, limit: int = 80) -> str:
    first = command.strip().splitlines()[0] if command.strip() else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


class ProcessStream:
    """A process on the controller (a command, or the srun that carries one), in a new
    session so that its whole group can be killed."""

    def __init__(self, argv: list[str], register: set[subprocess.Popen[bytes]],
                 lock: threading.Lock, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, env=env)
        self._register, self._lock = register, lock
        with lock:
            register.add(self.proc)
        self._selector = selectors.DefaultSelector()
        for pipe in (self.proc.stdout, self.proc.stderr):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            self._selector.register(pipe, selectors.EVENT_READ)
        self._open = 2
        self._writer: threading.Thread | None = None

    def send(self, data: bytes) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        if self._writer is not None:
            self._writer.join()
        self._writer = threading.Thread(target=_write_all, args=(stdin, data), daemon=True)
        self._writer.start()

    def close_stdin(self) -> None:
        stdin = self.proc.stdin
        if stdin is None:
            return
        if self._writer is not None:
            self._writer.join()
        with contextlib.suppress(OSError):
            stdin.close()

    def poll(self, wait: float) -> tuple[bytes, bytes]:
        out, err = b"", b""
        if not self._open:
            time.sleep(min(wait, 0.01))
            return out, err
        for key, _ in self._selector.select(wait):
            pipe: IO[bytes] = key.fileobj  # type: ignore[assignment]
            data = os.read(pipe.fileno(), 65536)
            if not data:
                self._selector.unregister(pipe)
                self._open -= 1
            elif pipe is self.proc.stdout:
                out += data
            else:
                err += data
        return out, err

    def finished(self) -> bool:
        return not self._open and self.proc.poll() is not None

    def status(self) -> int:
        return self.proc.wait()

    def lost(self) -> str | None:
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            _kill_group(self.proc)
            self.proc.wait()
        self._selector.close()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        with self._lock:
            self._register.discard(self.proc)


def _write_all(pipe: IO[bytes], data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        pipe.write(data)
        pipe.flush()


class ProcessRunner(CommandRunner):
    """A runner whose commands are processes on the controller (``sh``, ``srun``): it keeps
    them, so that ``close`` stops whatever still runs and a host timeout frees its worker."""

    def __init__(self, host: Host, budget: Budget | None = None) -> None:
        self.host = host
        self.round_trips = 0
        self.budget = budget or Budget()
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self.budget.attach(self)

    def reopen(self) -> Connection:
        raise NotImplementedError

    def close(self) -> None:
        """Stop whatever still runs."""
        with self._lock:
            running = list(self._running)
        for proc in running:
            self._stop(proc)

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        _kill_group(proc)


class LocalConnection(ProcessRunner):
    """Commands on the controller itself (``ansible_connection=local``)."""

    def _stream(self, line: str) -> _Stream:
        return ProcessStream(["sh", "-c", line], self._running, self._lock)

    def reopen(self) -> LocalConnection:
        """Another connection to the same host, under the same budget."""
        self.budget.admit("reconnect")
        return LocalConnection(self.host, self.budget)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill every process of the command's session (``timeout`` moves itself and the
    command into a process group of their own, so killing the group would miss them)."""
    for pid in _session_members(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _session_members(sid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 3 and fields[3] == str(sid):
            members.append(int(entry))
    return members


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def known_hosts_files(host: Host, base: Path) -> list[Path]:
    """The known_hosts files that vouch for ``host``, in the order they decide: the
    inventory's ``gpufleet_known_hosts``, the ``UserKnownHostsFile`` files of its ssh
    arguments (the first such option, as ssh reads it), then the user's."""
    files: list[Path] = []
    configured = host.vars.get("gpufleet_known_hosts")
    if configured:
        files.append(Path(os.path.normpath(base.absolute() / os.path.expanduser(str(configured)))))
    user_files = _ssh_option(host.ssh_common_args, "UserKnownHostsFile")
    if user_files:
        files.extend(Path(os.path.expanduser(v)) for v in user_files.split())
    files.append(Path.home() / ".ssh" / "known_hosts")
    return list(dict.fromkeys(files))


def _ssh_option(args: list[str], name: str) -> str | None:
    """The value of ``-o Name=value`` (or ``-J value`` for ProxyJump) in ssh arguments."""
    return ssh_option(args, name)


class SSHConnection(CommandRunner):
    """One SSH connection per host for the whole run, with verified host keys."""

    def __init__(self, host: Host, options: ConnectOptions | None = None,
                 budget: Budget | None = None) -> None:
        self.host = host
        self.options = options or ConnectOptions()
        self.round_trips = 0
        self.budget = budget or Budget()
        self.known_hosts = known_hosts_files(host, self.options.known_hosts_base)
        self._fabric: fabric.Connection | None = None
        self._lock = threading.Lock()
        self.accepted_fingerprint: str | None = None
        self.budget.attach(self)

    def _connection(self) -> fabric.Connection:
        with self._lock:
            if self._fabric is None:
                self.budget.admit(f"connect to {self.host.address}:{self.host.port}")
                self._fabric = self._open()
            return self._fabric

    def _connect_timeout(self) -> float:
        left = self.budget.remaining()
        timeout = self.options.connect_timeout
        return timeout if left is None else max(1.0, min(timeout, left))

    def _gateway(self) -> fabric.Connection | str | None:
        args = self.host.ssh_common_args
        command = _ssh_option(args, "ProxyCommand")
        if command:
            return command
        jump = _ssh_option(args, "ProxyJump")
        if not jump:
            return None
        try:
            hop = parse_jump(jump)
        except ValueError as exc:
            raise GpufleetError(f"host '{self.host.name}': ProxyJump '{jump}': {exc}") from None
        if hop is None:
            return None
        user, address, port = hop
        conn = fabric.Connection(address, user=user or self.host.user, port=port,
                                 connect_kwargs=self._auth_kwargs(),
                                 connect_timeout=int(self._connect_timeout()))
        self._harden(conn.client, known_hosts_name(conn.host, conn.port), accept_new=False)
        return conn

    def _auth_kwargs(self) -> dict[str, object]:
        timeout = self._connect_timeout()
        kwargs: dict[str, object] = {"banner_timeout": timeout, "auth_timeout": timeout}
        key = self.host.private_key_file
        if key:
            kwargs["key_filename"] = [os.path.expanduser(key)]
        password = self.host.password
        if password:
            kwargs["password"] = password
        return kwargs

    def _harden(self, client: paramiko.SSHClient, name: str, accept_new: bool) -> VerifyPolicy:
        trust_known(client, name, self.known_hosts)
        policy = VerifyPolicy(self.known_hosts, accept_new=accept_new,
                              record_to=self.known_hosts[0],
                              expect_fingerprint=self.options.expect_fingerprint)
        client.set_missing_host_key_policy(policy)
        return policy

    def _open(self) -> fabric.Connection:
        host = self.host
        conn = fabric.Connection(
            host.address, user=host.user or getpass.getuser(), port=host.port,
            connect_kwargs=self._auth_kwargs(),
            connect_timeout=int(self._connect_timeout()),
            gateway=self._gateway(),
        )
        policy = self._harden(conn.client, known_hosts_name(conn.host, conn.port),
                              self.options.accept_new_host_keys)
        gateway = conn.gateway
        while isinstance(gateway, fabric.Connection):  # a jump host from ssh_config too
            self._harden(gateway.client, known_hosts_name(gateway.host, gateway.port),
                         accept_new=False)
            gateway = gateway.gateway
        where = f"{host.address}:{host.port}"
        try:
            conn.open()
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(changed_key_message(exc, self.known_hosts)) from exc
        except HostKeyError:
            raise
        except paramiko.AuthenticationException as exc:
            raise GpufleetError(f"authentication failed for {conn.user}@{where}: {exc}") from exc
        except TimeoutError as exc:
            raise Unreachable(f"connect to {where} timed out after "
                              f"{self._connect_timeout():.0f}s") from exc
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise Unreachable(f"cannot connect to {where}: {_reason(exc)}") from exc
        transport = conn.client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)
        self.accepted_fingerprint = policy.accepted
        return conn

    def connect(self) -> None:
        """Open the connection now (otherwise the first command opens it)."""
        self._connection()

    def host_key(self) -> tuple[str, str]:
        """The (type, SHA256 fingerprint) of the key the host presented."""
        transport = self._connection().client.get_transport()
        if transport is None:
            raise Unreachable(f"connection to {self.host.address} was lost")
        key = transport.get_remote_server_key()
        return key.get_name(), fingerprint(key)

    def _stream(self, line: str) -> _Stream:
        transport = self._connection().client.get_transport()
        if transport is None or not transport.is_active():
            raise Unreachable(f"connection to {self.host.address} was lost")
        try:
            chan = transport.open_session(timeout=self.options.connect_timeout)
            chan.exec_command(line)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise Unreachable(f"connection to {self.host.address} was lost: {_reason(exc)}"
                              ) from exc
        return _ChannelStream(chan, self.host.address)

    def reopen(self) -> SSHConnection:
        """A new connection to the same host (a new SSH session), under the same budget."""
        self.budget.admit(f"reconnect to {self.host.address}")
        return SSHConnection(self.host, self.options, self.budget)

    def close(self) -> None:
        with self._lock:
            current, self._fabric = self._fabric, None
        if current is not None:
            current.close()
            gateway = current.gateway
            if isinstance(gateway, fabric.Connection):
                gateway.close()


class _ChannelStream:
    """One command on an SSH session channel."""

    def __init__(self, chan: paramiko.Channel, address: str) -> None:
        self.chan = chan
        self.address = address
        self._eof = False

    def _guard(self, action: str, func: Callable[[], _R]) -> _R:
        try:
            return func()
        except TimeoutError:
            raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise Unreachable(f"connection to {self.address} dropped while {action}: "
                              f"{_reason(exc)}") from exc

    def send(self, data: bytes) -> None:
        self._guard("sending input", lambda: self.chan.sendall(data))

    def close_stdin(self) -> None:
        self._guard("sending input", self.chan.shutdown_write)

    def _stderr(self) -> bytes:
        err = b""
        while self.chan.recv_stderr_ready():
            err += self.chan.recv_stderr(65536)
        return err

    def poll(self, wait: float) -> tuple[bytes, bytes]:
        err = self._stderr()
        if self._eof:
            self.chan.status_event.wait(wait)
            return b"", err + self._stderr()
        self.chan.settimeout(wait)
        try:
            out = self._guard("a command ran", lambda: self.chan.recv(65536))
        except TimeoutError:
            return b"", err
        if not out:
            self._eof = True
        return out, err + self._stderr()

    def finished(self) -> bool:
        return self._eof and self.chan.exit_status_ready() and not self.chan.recv_stderr_ready()

    def status(self) -> int:
        rc = self.chan.recv_exit_status()
        if rc == -1:
            raise Unreachable(f"connection to {self.address} dropped while a command ran "
                              "(no exit status)")
        return rc

    def lost(self) -> str | None:
        transport = self.chan.get_transport()
        if transport is None or not transport.is_active():
            return f"connection to {self.address} dropped while a command ran"
        if self._eof and self.chan.closed and not self.chan.exit_status_ready():
            return f"connection to {self.address} dropped while a command ran (no exit status)"
        return None

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.chan.close()


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        errors = list(exc.errors.values())
        if errors:
            text = str(errors[0])
    return text or type(exc).__name__


Connector = Callable[[Host, ConnectOptions, Budget], Connection]
"""How a run reaches a host: ``connect`` (SSH or local), or the srun launcher's."""


def connect(host: Host, options: ConnectOptions | None = None, budget: Budget | None = None
            ) -> SSHConnection | LocalConnection:
    """A connection of the kind the host's ``ansible_connection`` asks for."""
    if host.connection == "local":
        return LocalConnection(host, budget)
    return SSHConnection(host, options, budget)


def local_put(path: str, content: bytes, mode: int = 0o644) -> None:
    """Write a controller-side file atomically (temp file in the same directory + rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
