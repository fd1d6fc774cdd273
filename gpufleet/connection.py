"""Connections to hosts: SSH (Fabric/paramiko) and local, with one shared interface.

Every command runs on the host under ``timeout`` so that a hung command is killed
there too; ``put`` writes through a temporary file and a rename, keeping a backup.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

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


class Unreachable(GpufleetError):
    """The host could not be reached or the connection dropped."""


class CommandTimeout(GpufleetError):
    """A command ran past its timeout and was killed."""


class CommandFailed(GpufleetError):
    """A command that had to succeed returned a non-zero exit status."""


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

    def run(self, command: str, *, timeout: float = 120.0, stdin: bytes | None = None,
            become: bool | None = None) -> CommandResult: ...

    def put(self, path: str, content: bytes, *, mode: int = 0o644, owner: str = "root:root",
            backup: bool = True) -> None: ...

    def close(self) -> None: ...


def wrap_command(command: str, timeout: float, sudo: list[str]) -> str:
    """The remote command line: optional sudo, then coreutils timeout around ``sh -c``."""
    limit = max(1, int(timeout))
    return shlex.join([*sudo, "timeout", "-k", str(KILL_GRACE_S), str(limit), "sh", "-c",
                       command])


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


class _CommandRunner:
    """Shared run/put behaviour; subclasses provide ``_exec``."""

    host: Host
    round_trips: int

    def _exec(self, line: str, timeout: float, stdin: bytes | None) -> tuple[int, str, str]:
        raise NotImplementedError

    def _sudo_prefix(self, become: bool | None) -> tuple[list[str], bytes | None]:
        wanted = self.host.become if become is None else become
        if not wanted:
            return [], None
        password = self.host.vars.get("ansible_become_password")
        user = self.host.become_user
        if password:
            return ["sudo", "-S", "-p", "", "-H", "-u", user, "--"], f"{password}\n".encode()
        return ["sudo", "-n", "-H", "-u", user, "--"], None

    def run(self, command: str, *, timeout: float = 120.0, stdin: bytes | None = None,
            become: bool | None = None) -> CommandResult:
        """Run ``command`` with sh on the host; a hung command is killed after ``timeout``."""
        sudo, secret = self._sudo_prefix(become)
        payload = (secret or b"") + (stdin or b"") if (secret or stdin) else None
        start = time.monotonic()
        self.round_trips += 1
        rc, out, err = self._exec(wrap_command(command, timeout, sudo), timeout, payload)
        duration = time.monotonic() - start
        if rc == 124 or (rc == 137 and duration >= timeout):
            raise CommandTimeout(f"command timed out after {timeout:.0f}s: {_short(command)}")
        return CommandResult(command, rc, out, err, duration)

    def put(self, path: str, content: bytes, *, mode: int = 0o644, owner: str = "root:root",
            backup: bool = True) -> None:
        """Write ``content`` to ``path`` atomically, keeping the previous file as a backup."""
        self.run(put_script(path, mode, owner, backup), stdin=content).check(f"writing {path}")


def _short(command: str, limit: int = 80) -> str:
    first = command.strip().splitlines()[0] if command.strip() else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


class LocalConnection(_CommandRunner):
    """Commands on the controller itself (``ansible_connection=local``)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.round_trips = 0
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()

    def _exec(self, line: str, timeout: float, stdin: bytes | None) -> tuple[int, str, str]:
        proc = subprocess.Popen(["sh", "-c", line], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        with self._lock:
            self._running.add(proc)
        try:
            out, err = proc.communicate(stdin or b"", timeout=timeout + KILL_GRACE_S + 5)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return 124, "", ""
        finally:
            with self._lock:
                self._running.discard(proc)
        return proc.returncode, _text(out), _text(err)

    def close(self) -> None:
        """Stop whatever still runs, so that a host timeout frees its worker."""
        with self._lock:
            running = list(self._running)
        for proc in running:
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


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


class SSHConnection(_CommandRunner):
    """One SSH connection per host for the whole run, with verified host keys."""

    def __init__(self, host: Host, options: ConnectOptions | None = None) -> None:
        self.host = host
        self.options = options or ConnectOptions()
        self.round_trips = 0
        self.known_hosts = known_hosts_files(host, self.options.known_hosts_base)
        self._fabric: fabric.Connection | None = None
        self.accepted_fingerprint: str | None = None

    def _connection(self) -> fabric.Connection:
        if self._fabric is None:
            self._fabric = self._open()
        return self._fabric

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
                                 connect_timeout=int(self.options.connect_timeout))
        self._harden(conn.client, known_hosts_name(conn.host, conn.port), accept_new=False)
        return conn

    def _auth_kwargs(self) -> dict[str, object]:
        kwargs: dict[str, object] = {"banner_timeout": self.options.connect_timeout,
                                     "auth_timeout": self.options.connect_timeout}
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
            connect_timeout=int(self.options.connect_timeout),
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
                              f"{self.options.connect_timeout:.0f}s") from exc
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

    def _exec(self, line: str, timeout: float, stdin: bytes | None) -> tuple[int, str, str]:
        transport = self._connection().client.get_transport()
        if transport is None or not transport.is_active():
            raise Unreachable(f"connection to {self.host.address} was lost")
        try:
            chan = transport.open_session(timeout=self.options.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise Unreachable(f"connection to {self.host.address} was lost: {_reason(exc)}"
                              ) from exc
        try:
            rc, out, err = _drive_channel(chan, line, stdin, timeout + KILL_GRACE_S + 5)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise Unreachable(f"connection to {self.host.address} dropped: {_reason(exc)}"
                              ) from exc
        finally:
            chan.close()
        if rc == -1:
            raise Unreachable(f"connection to {self.host.address} dropped while a command ran "
                              "(no exit status)")
        return rc, out, err

    def close(self) -> None:
        if self._fabric is not None:
            self._fabric.close()
            gateway = self._fabric.gateway
            if isinstance(gateway, fabric.Connection):
                gateway.close()
            self._fabric = None


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        errors = list(exc.errors.values())
        if errors:
            text = str(errors[0])
    return text or type(exc).__name__


def _drive_channel(chan: paramiko.Channel, line: str, stdin: bytes | None,
                   deadline_s: float) -> tuple[int, str, str]:
    """Run one command on an open session channel and collect both streams."""
    deadline = time.monotonic() + deadline_s
    chan.settimeout(0.2)
    chan.exec_command(line)
    if stdin:
        chan.sendall(stdin)
    chan.shutdown_write()
    out: list[bytes] = []
    err: list[bytes] = []
    while True:
        while chan.recv_stderr_ready():
            err.append(chan.recv_stderr(65536))
        try:
            data = chan.recv(65536)
        except TimeoutError:
            if time.monotonic() > deadline:
                return 124, _text(b"".join(out)), _text(b"".join(err))
            continue
        if not data:
            break
        out.append(data)
    while not chan.exit_status_ready():
        if time.monotonic() > deadline:
            return 124, _text(b"".join(out)), _text(b"".join(err))
        chan.status_event.wait(0.05)
    while chan.recv_stderr_ready():
        err.append(chan.recv_stderr(65536))
    return chan.recv_exit_status(), _text(b"".join(out)), _text(b"".join(err))


def connect(host: Host, options: ConnectOptions | None = None) -> SSHConnection | LocalConnection:
    """A connection of the kind the host's ``ansible_connection`` asks for."""
    if host.connection == "local":
        return LocalConnection(host)
    return SSHConnection(host, options)


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
