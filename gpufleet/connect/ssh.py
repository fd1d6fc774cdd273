"""SSH connections (Fabric on paramiko): one per host for the run, host keys verified."""

from __future__ import annotations

import contextlib
import getpass
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import fabric
import paramiko

from gpufleet.connect.connection import Budget, CommandRunner, ConnectOptions, Stream, Unreachable
from gpufleet.connect.hostkeys import (
    HostKeyError,
    VerifyPolicy,
    changed_key_message,
    fingerprint,
    known_hosts_name,
    trust_known,
)
from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host
from gpufleet.inventory.variables import parse_jump, ssh_option

_R = TypeVar("_R")


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
        self._names: list[str] = []  # the known_hosts names looked up, jump hosts' too
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
        self._names.append(name)
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
            raise HostKeyError(changed_key_message(exc, self.known_hosts, self._names)
                               ) from exc
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

    def _stream(self, line: str) -> Stream:
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


