"""Node-local commands of many nodes as one job step (``--launcher slurm``).

Commands issued in a node-local context (``gpufleet.connect.connection.node_local``: the
facts round trip, a node-local check run on every node at once) are not a step each.
Commands of different nodes that arrive together (all of them, or whatever arrived within
``WINDOW_S`` of the first) become one step over those nodes: ``srun --nodes=K
--distribution=arbitrary``, task I on the I-th node the controller lists), which slurmd
fans out itself. Each node's command reaches every task on the step's stdin (base64, one
line per task with its node, its command and the command's own stdin, never on a command
line); each task runs the line of its own rank and node (``SLURM_PROCID``,
``SLURMD_NODENAME``, as slurmstepd sets them) in an environment as plain as an SSH
session's and prints its exit status, stdout and stderr framed and base64-encoded.

Which node a result is for comes from the step, never from the frame: srun labels every
line with its task (``--label``, which a task cannot forge: whatever it prints is behind
srun's label), and the controller laid task I out on node I. A task whose frames name
another node or another rank, or that frames a second result, has its own node's result
refused (that node is unreachable, with the reason); no task can answer for another.

Checks on one node run their commands in turn and the nodes of one check end a combined
step at the same moment, so the next round's commands arrive together again. A node whose
task never started is unreachable, as with a step of its own. A command whose stdin is
larger than ``STDIN_MAX`` (every task receives every node's line) or that needs a become
password keeps a step of its own.
"""

from __future__ import annotations

import base64
import contextlib
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Protocol

from gpufleet.connect.connection import Unreachable
from gpufleet.slurm.client import Slurm, SlurmNode

WINDOW_S = 0.15
STDIN_MAX = 256 * 1024
STOP_GRACE_S = 3.0
START, BEGIN = "@@gpufleet-start", "@@gpufleet-begin"
ERR, END = "@@gpufleet-stderr", "@@gpufleet-end"
ABORTED = 137  # a command whose step ended under it, as a killed command's status
_LABELLED = re.compile(r"^\s*(\d+): ?(.*)$")
_TASK_EXIT = re.compile(r"^srun: error: \S+: tasks? [0-9,-]+: "
                        r"(?:Exited with exit code \d+|Killed|Terminated)\s*$")


def dispatch_script(path: str) -> str:
    """What each task runs: the command of its rank and node from stdin, then the framed
    result."""
    return "\n".join([
        'n="$SLURMD_NODENAME" r="$SLURM_PROCID"',
        't=$(mktemp -d) || exit 111',
        "trap 'rm -rf \"$t\"' EXIT",
        "trap 'exit 143' HUP INT TERM",
        "awk -v r=\"$r\" -v n=\"$n\" -v d=\"$t\" '$1 == r && $2 == n "
        "{ print $3 > (d \"/c64\"); if ($4 != \"-\") print $4 > (d \"/i64\") }'"
        " || exit 112",
        'base64 -d "$t/c64" > "$t/c" || exit 112',
        'if [ -s "$t/i64" ]; then base64 -d "$t/i64" > "$t/i" || exit 112; '
        'else : > "$t/i"; fi',
        f"printf '%s %s %s\\n' {START} \"$r\" \"$n\"",
        f"/usr/bin/env -i PATH={shlex.quote(path)} /bin/sh \"$t/c\" < \"$t/i\" "
        '> "$t/o" 2> "$t/e"',
        "rc=$?",
        f"printf '%s %s\\n' {BEGIN} \"$n\"",
        'base64 "$t/o"',
        f"printf '%s\\n' {ERR}",
        'base64 "$t/e"',
        f"printf '%s %d\\n' {END} \"$rc\"",
    ])


@dataclass
class Ticket:
    """One node's command waiting for, or carried by, a combined step."""

    node: str
    line: str
    gpus: int
    stdin: bytes = b""
    done: threading.Event = field(default_factory=threading.Event)
    rc: int | None = None
    out: bytes = b""
    err: bytes = b""
    said: str = ""
    refused: str = ""
    abandoned: bool = False
    step: _Step | None = None


@dataclass
class _Step:
    tickets: list[Ticket]
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class _Task:
    node: str
    started: bool = False
    part: str = "head"
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    rc: int | None = None
    refused: str = ""


class TaskOutputs:
    """A combined step's labelled output, split per task as its lines arrive. Task I is
    node ``nodes[I]``: srun's label says which task printed a line, the step's layout which
    node that task is on; a frame only confirms it."""

    def __init__(self, nodes: Sequence[str]) -> None:
        self._tasks = [_Task(node) for node in nodes]

    def feed(self, line: str) -> str | None:
        """Take one line of srun's stdout; the node whose task this line ended, or None."""
        labelled = _LABELLED.match(line)
        if labelled is None or int(labelled.group(1)) >= len(self._tasks):
            return None
        rank, text = int(labelled.group(1)), labelled.group(2)
        task = self._tasks[rank]
        if task.refused or task.part == "tail":
            return None
        if text.startswith(START + " "):
            claim = text[len(START) + 1:].split()
            if task.started or claim != [str(rank), task.node]:
                return self._refuse(task, f"{START} {' '.join(claim)}")
            task.started = True
        elif text.startswith(BEGIN + " "):
            if task.part != "head" or text[len(BEGIN) + 1:].strip() != task.node:
                return self._refuse(task, text)
            task.part = "out"
        elif text == ERR and task.part == "out":
            task.part = "err"
        elif text.startswith(END + " ") and task.part == "err":
            with contextlib.suppress(ValueError):
                task.rc = int(text[len(END) + 1:])
            task.part = "tail"
            return task.node
        elif task.part == "out":
            task.out.append(text)
        elif task.part == "err":
            task.err.append(text)
        return None

    def _refuse(self, task: _Task, frame: str) -> str:
        """A frame the task's own node and rank do not make: the node's result is refused."""
        task.refused = (f"its task in the combined step framed another result "
                        f"({frame[:120]!r}): refused")
        return task.node

    def _task(self, node: str) -> _Task | None:
        return next((t for t in self._tasks if t.node == node), None)

    def result(self, node: str) -> tuple[int | None, bytes, bytes] | None:
        """(exit status, or None when the task stopped early; stdout; stderr) of the
        node's task, or None when it printed nothing of its own or was refused."""
        task = self._task(node)
        if task is None or task.refused or not (task.started or task.part != "head"):
            return None
        return task.rc, _decoded(task.out), _decoded(task.err)

    def started(self, node: str) -> bool:
        """Whether the node's task got as far as starting its command."""
        task = self._task(node)
        return task is not None and task.started

    def refused(self, node: str) -> str:
        """Why the node's result is refused ("" when it is not)."""
        task = self._task(node)
        return task.refused if task is not None else ""


def _decoded(lines: list[str]) -> bytes:
    try:
        return base64.b64decode("".join(lines), validate=True)
    except ValueError:
        return b""


class StepAllocation(Protocol):
    """What a combined step needs of the run's allocation (the launcher's ``Allocation``,
    which holds the fan-out: named here so that neither module imports the other)."""

    @property
    def slurm(self) -> Slurm: ...

    @property
    def job_id(self) -> str | None: ...

    @property
    def nodes(self) -> Mapping[str, SlurmNode]: ...


class StepFanout:
    """Gathers the node-local commands of an allocation's nodes into combined steps."""

    def __init__(self, allocation: StepAllocation, path: str, window_s: float = WINDOW_S
                 ) -> None:
        self.allocation = allocation
        self.path = path
        self.window_s = window_s
        self.steps = 0
        self._pending: list[Ticket] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._round = 0

    def submit(self, node: str, line: str, gpus: int, stdin: bytes = b"") -> Ticket:
        """Queue ``line`` for ``node`` (with ``stdin``); it starts with the next combined
        step."""
        ticket = Ticket(node, line, gpus, stdin)
        with self._lock:
            self._pending.append(ticket)
            if {t.node for t in self._pending} >= set(self._names()):
                self._flush_locked()
            elif self._timer is None:
                self._arm()
        return ticket

    def _arm(self) -> None:
        """Flush the pending commands ``window_s`` from now (this round only)."""
        self._round += 1
        self._timer = threading.Timer(self.window_s, self._flush, args=(self._round,))
        self._timer.daemon = True
        self._timer.start()

    def abandon(self, ticket: Ticket) -> None:
        """The caller no longer waits: a queued command is dropped, and a step whose every
        command was abandoned or answered is stopped."""
        with self._lock:
            ticket.abandoned = True
            if ticket in self._pending:
                self._pending.remove(ticket)
                ticket.done.set()
                return
            step = ticket.step
        if step is not None and all(t.abandoned or t.done.is_set() for t in step.tickets):
            _stop(step.proc)

    def _names(self) -> list[str]:
        return [n.name for n in self.allocation.nodes.values()]

    def _flush(self, round_: int) -> None:
        with self._lock:
            if self._timer is not None and round_ == self._round:
                self._flush_locked()

    def _flush_locked(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        taken: dict[str, Ticket] = {}
        waiting: list[Ticket] = []
        for ticket in self._pending:
            if ticket.node in taken:
                waiting.append(ticket)
            else:
                taken[ticket.node] = ticket
        self._pending = waiting
        by_gpus: dict[int, list[Ticket]] = {}
        order = {name: i for i, name in enumerate(self._names())}
        for ticket in sorted(taken.values(), key=lambda t: order.get(t.node, len(order))):
            by_gpus.setdefault(ticket.gpus, []).append(ticket)
        for tickets in by_gpus.values():
            step = _Step(tickets)
            for ticket in tickets:
                ticket.step = step
            self.steps += 1
            threading.Thread(target=self._run, args=(step,), daemon=True,
                             name="gpufleet-step").start()
        if self._pending:
            self._arm()

    def argv(self, tickets: Sequence[Ticket]) -> list[str]:
        """srun's words for one combined step over the tickets' nodes."""
        names = [t.node for t in tickets]
        argv = ["srun", f"--jobid={self.allocation.job_id}", f"--nodelist={','.join(names)}",
                f"--nodes={len(names)}", f"--ntasks={len(names)}", "--ntasks-per-node=1",
                "--distribution=arbitrary", "--overlap", "--quiet", "--kill-on-bad-exit=0",
                "--wait=0", "--export=NONE", "--label", "--input=all"]
        if tickets[0].gpus:
            argv.append(f"--gres=gpu:{tickets[0].gpus}")
        return [*argv, "/bin/sh", "-c", dispatch_script(self.path)]

    def _run(self, step: _Step) -> None:
        """Run one combined step; each ticket gets its result as soon as its task ends."""
        bundle = b"".join(b"%d %s %s %s\n" % (rank, t.node.encode(),
                                              base64.b64encode(t.line.encode()),
                                              base64.b64encode(t.stdin) or b"-")
                          for rank, t in enumerate(step.tickets))
        waiting = {t.node: t for t in step.tickets}
        outputs = TaskOutputs([t.node for t in step.tickets])
        stderr: list[str] = []
        try:
            proc = step.proc = subprocess.Popen(
                self.argv(step.tickets), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
                env=self.allocation.slurm.environment())
            if all(t.abandoned for t in step.tickets):
                _stop(proc)
            threads = [threading.Thread(target=_write_all, args=(proc.stdin, bundle),
                                        daemon=True),
                       threading.Thread(target=_read_lines, args=(proc.stderr, stderr),
                                        daemon=True)]
            for thread in threads:
                thread.start()
            assert proc.stdout is not None
            for raw in proc.stdout:
                ended = outputs.feed(raw.decode(errors="replace").rstrip("\n"))
                if ended in waiting:
                    _deliver(waiting.pop(ended), outputs.result(ended), "",
                             outputs.refused(ended))
            proc.wait()
            for thread in threads:
                thread.join()
        except OSError as exc:
            stderr.append(f"srun: {exc}")
        finally:
            if step.proc is not None and step.proc.poll() is None:
                _stop(step.proc)
            self._settle(step, waiting, outputs, stderr)

    def _settle(self, step: _Step, waiting: dict[str, Ticket], outputs: TaskOutputs,
                stderr: list[str]) -> None:
        """The tickets whose task printed no end: one whose command never started runs
        again in a step of its own (a node lost from the allocation fails a whole step);
        one whose command started and was cut off ends as killed; alone, never started,
        the node is unreachable."""
        said = "; ".join(line.strip() for line in stderr
                         if line.startswith("srun: ") and not _TASK_EXIT.match(line))
        again = [t for n, t in waiting.items() if not outputs.started(n) and not t.abandoned]
        if len(step.tickets) > 1 and again:
            self._one_by_one(again)
        for node, ticket in waiting.items():
            if ticket in again and len(step.tickets) > 1:
                continue
            if outputs.started(node):
                rc, out, err = outputs.result(node) or (None, b"", b"")
                note = f"gpufleet: the job step ended before the command: {said or 'no reason'}"
                _deliver(ticket, (ABORTED if rc is None else rc, out, err + note.encode()), said)
            else:
                _deliver(ticket, None, said)

    def _one_by_one(self, tickets: Sequence[Ticket]) -> None:
        """A combined step in which no task started (one node lost from the allocation
        fails the whole step): each command again, in a step of its own."""
        singles = []
        for ticket in tickets:
            single = _Step([ticket])
            ticket.step = single
            self.steps += 1
            singles.append(threading.Thread(target=self._run, args=(single,), daemon=True,
                                            name="gpufleet-step"))
        for thread in singles:
            thread.start()


def _deliver(ticket: Ticket, found: tuple[int | None, bytes, bytes] | None, said: str,
             refused: str = "") -> None:
    if found is not None:
        ticket.rc, ticket.out, ticket.err = found
    ticket.said, ticket.refused = said, refused
    ticket.done.set()


def _write_all(pipe: IO[bytes] | None, data: bytes) -> None:
    if pipe is None:
        return
    with contextlib.suppress(OSError, ValueError):
        pipe.write(data)
    with contextlib.suppress(OSError, ValueError):
        pipe.close()


def _read_lines(pipe: IO[bytes] | None, lines: list[str]) -> None:
    if pipe is not None:
        lines.extend(raw.decode(errors="replace").rstrip("\n") for raw in pipe)


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    """srun ends its step on SIGTERM; one that does not is killed."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


class FanoutStream:
    """A command carried by a combined step, as a ``Stream``: its output comes whole when
    the step ends."""

    def __init__(self, fanout: StepFanout, node: str, line: str, gpus: int) -> None:
        self.fanout = fanout
        self.ticket = Ticket(node, line, gpus)
        self._stdin = bytearray()
        self._submitted = self._delivered = self._cancelled = False
        self._lock = threading.Lock()

    def send(self, data: bytes) -> None:
        self._stdin += data

    def close_stdin(self) -> None:
        """The command is complete: it joins the next combined step (unless cancelled)."""
        with self._lock:
            if self._submitted or self._cancelled:
                return
            self._submitted = True
            t = self.ticket
            self.ticket = self.fanout.submit(t.node, t.line, t.gpus, bytes(self._stdin))

    def poll(self, wait: float) -> tuple[bytes, bytes]:
        with self._lock:
            submitted, delivered = self._submitted, self._delivered
        if delivered or not submitted:
            time.sleep(min(wait, 0.01))
            return b"", b""
        if not self.ticket.done.wait(wait):
            return b"", b""
        with self._lock:
            if self._delivered:
                return b"", b""
            self._delivered = True
        return self.ticket.out, self.ticket.err

    def finished(self) -> bool:
        with self._lock:
            return self._delivered

    def status(self) -> int:
        if self.ticket.refused:
            raise Unreachable(f"{self.ticket.node}: {self.ticket.refused}")
        if self.ticket.rc is None:
            said = self.ticket.said or "its task printed no exit status"
            raise Unreachable(f"{self.ticket.node}: no job step started: {said}")
        return self.ticket.rc

    def lost(self) -> str | None:
        return None

    def stop(self) -> None:
        with self._lock:
            waiting = self._submitted and not self._delivered
        if waiting:
            self.fanout.abandon(self.ticket)

    def cancel(self) -> None:
        """End the wait now (the host's run was cancelled): the command counts as lost,
        and one not yet queued never is."""
        with self._lock:
            if self._delivered:
                return
            self._cancelled = self._delivered = True
            submitted = self._submitted
            self.ticket.rc = None
            self.ticket.said = "the host's run was cancelled"
        if submitted:
            self.fanout.abandon(self.ticket)
