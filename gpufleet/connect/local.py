"""Commands run on the controller itself (``ansible_connection: local``) and the process
runner that the srun launcher shares: a new session per command, its group killed on
timeout."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

from gpufleet.connect.connection import Budget, CommandRunner, Connection, Stream
from gpufleet.inventory.model import Host


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

    def _stream(self, line: str) -> Stream:
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


