"""Slurm in the lab: munged and slurmctld on the controller, slurmd inside every node.

Everything lives under ``<lab root>/slurm``: the configuration (``etc/slurm.conf``,
``gres.conf``, ``cgroup.conf``), the lab's own munge key and socket, slurmctld's state,
each node's spool directory, pid files and logs. slurmctld runs in the controller's network
namespace but in a private mount and UTS namespace whose host name resolves to the lab's
bridge address only, so with ``CommunicationParameters=NoCtldInAddrAny`` it listens on that
address alone. Each slurmd runs inside its node's namespaces, where ``/etc/slurm/slurm.conf``
is a link to the lab's file, so ``scontrol`` on a node works as on a real cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpufleet.errors import LabError
from gpufleet.lab import localcmd
from gpufleet.lab.model import LabConfig, Node
from gpufleet.slurm.client import Slurm, SlurmError, SlurmNode

TOOLS = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "unshare")
INSTALL_HINT = "install them with: apt-get install slurmctld slurmd slurm-client munge"
PARTITION = "lab"
HEALTH_CHECK_PROGRAM = "/usr/local/sbin/gpufleet-healthcheck"
DAEMONS = ("munged", "slurmctld", "slurmd")
START_TIMEOUT = 30.0


@dataclass(frozen=True)
class SlurmSettings:
    """What every lab node offers to Slurm, how often slurmd runs the health check, and the
    prolog and epilog it runs at each job's start and end (none when empty)."""

    cpus: int = 4
    gpus: int = 2
    health_check_interval: int = 60
    nodes: tuple[str, ...] = field(default=())
    prolog: str = ""
    epilog: str = ""


@dataclass(frozen=True)
class SlurmStatus:
    """What lab.status reports about Slurm."""

    munged: int | None
    slurmctld: int | None
    slurmd: dict[str, int | None]
    nodes: list[SlurmNode]
    error: str | None
    conf: Path

    @property
    def up(self) -> bool:
        return bool(self.munged and self.slurmctld and all(self.slurmd.values())
                    and not self.error)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") \
            .rstrip("\0").split("\0")
    except OSError:
        return []


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    tmp.replace(path)


class LabSlurm:
    """The Slurm cluster of one lab: start, keep in step with the nodes, inspect, stop."""

    def __init__(self, config: LabConfig) -> None:
        self.config = config
        self.dir = config.root / "slurm"
        self.conf = self.dir / "etc" / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.client = Slurm(conf=self.conf, timeout=15.0)

    # ---- state -----------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether the lab runs Slurm (``lab.up --slurm`` wrote its settings)."""
        return self._settings_file.is_file()

    @property
    def controller_name(self) -> str:
        return f"{self.config.name}-ctl"

    @property
    def _settings_file(self) -> Path:
        return self.dir / "lab-slurm.json"

    def settings(self) -> SlurmSettings:
        data = json.loads(self._settings_file.read_text())
        return SlurmSettings(cpus=data["cpus"], gpus=data["gpus"],
                             health_check_interval=data["health_check_interval"],
                             nodes=tuple(data["nodes"]), prolog=data.get("prolog", ""),
                             epilog=data.get("epilog", ""))

    def _pidfile(self, daemon: str, node: str | None = None) -> Path:
        return self.dir / "run" / (f"{daemon}-{node}.pid" if node else f"{daemon}.pid")

    def _pid(self, daemon: str, node: str | None = None) -> int | None:
        """The daemon's pid, if its pid file names a live process of this lab's Slurm."""
        try:
            pid = int(self._pidfile(daemon, node).read_text().strip())
        except (OSError, ValueError):
            return None
        argv = _cmdline(pid)
        if argv and Path(argv[0]).name == daemon and str(self.dir) in " ".join(argv):
            return pid
        return None

    def _processes(self) -> list[int]:
        """Every munged, slurmctld and slurmd process started for this lab."""
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (argv := _cmdline(int(entry))) and \
                    Path(argv[0]).name in DAEMONS and str(self.dir) in " ".join(argv):
                pids.append(int(entry))
        return pids

    # ---- start and keep in step ------------------------------------------------------

    def converge(self, nodes: list[Node], settings: SlurmSettings | None = None) -> None:
        """Run Slurm over ``nodes`` if the lab has it or ``settings`` are given: write the
        configuration, start munged and slurmctld, restart slurmctld when the configuration
        changed (Slurm 22.05 cannot add or remove nodes on reconfigure) and have every
        slurmd re-read it, and start slurmd on every node that lacks one."""
        if settings is None and not self.enabled:
            return
        localcmd.require_tools(TOOLS, INSTALL_HINT)
        base = settings or self.settings()
        wanted = SlurmSettings(base.cpus, base.gpus, base.health_check_interval,
                               tuple(n.name for n in nodes), base.prolog, base.epilog)
        before = self.conf.read_text() if self.conf.is_file() else None
        self._prepare(wanted)
        changed = self._write_config(wanted, nodes) != before
        if not nodes:
            self._stop_daemons()
            return
        self._start_munged()
        running = self._pid("slurmctld")
        if changed and running is not None:
            self._stop_pids([running])
        if self._pid("slurmctld") is None:
            self._start_slurmctld()
            if changed and before is not None:
                self.client.run(["scontrol", "reconfigure"])
        for node in nodes:
            self._start_slurmd(node)
        self._wait_registered([n.name for n in nodes])

    def node_booted(self, node: Node) -> None:
        """Start slurmd on a node that has just booted, if the lab's Slurm includes it."""
        if self.enabled and node.name in self.settings().nodes and \
                self._pid("slurmctld") is not None:
            self._start_slurmd(node)

    def _prepare(self, settings: SlurmSettings) -> None:
        for sub in ("etc", "munge", "state", "spool", "log", "run", "gpu"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "munge").chmod(0o755)
        key = self.dir / "munge" / "munge.key"
        if not key.exists():
            _write_atomic(key, os.urandom(1024).hex(), mode=0o600)
        for name in settings.nodes:
            (self.dir / "spool" / name).mkdir(exist_ok=True)
        for index in range(settings.gpus):
            _gpu_device(self.dir / "gpu" / f"nvidia{index}", index)
        _write_atomic(self._settings_file, json.dumps(asdict(settings), indent=2) + "\n")

    def _write_config(self, settings: SlurmSettings, nodes: list[Node]) -> str:
        """Write slurm.conf and the files beside it; return slurm.conf's text."""
        etc = self.dir / "etc"
        _write_atomic(etc / "hosts", f"127.0.0.1 localhost\n"
                                     f"{self.config.controller_address} {self.controller_name}\n")
        _write_atomic(etc / "cgroup.conf", "# Generated by the gpufleet lab; do not edit.\n"
                      "# Lab nodes use no cgroup plugin; v1's start needs no mounted cgroups.\n"
                      "CgroupPlugin=cgroup/v1\n")
        gres = f"Name=gpu File={self.dir}/gpu/nvidia[0-{settings.gpus - 1}]\n" \
            if settings.gpus else ""
        _write_atomic(etc / "gres.conf", "# Generated by the gpufleet lab; do not edit.\n"
                      "# Stand-in GPUs: Slurm needs a File= per GPU, a device node.\n" + gres)
        text = self.render_config(settings, nodes)
        _write_atomic(self.conf, text)
        return text

    def render_config(self, settings: SlurmSettings, nodes: list[Node]) -> str:
        """slurm.conf for the lab: one NodeName line per node, all in partition ``lab``."""
        d = self.dir
        gres = f" Gres=gpu:{settings.gpus}" if settings.gpus else ""
        lines = [
            f"# Generated by the gpufleet lab {self.config.name}; do not edit.",
            f"ClusterName={self.config.name}",
            f"SlurmctldHost={self.controller_name}({self.config.controller_address})",
            "SlurmctldPort=6817",
            "SlurmdPort=6818",
            "# slurmctld binds the address its host name resolves to: the lab bridge only",
            "CommunicationParameters=NoCtldInAddrAny",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "# a requeued job waits cred_expire (default 120 s) before it may start again",
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={self._pidfile('slurmctld')}",
            f"SlurmdPidFile={d}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log",
            f"SlurmdLogFile={d}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "# lab nodes share the controller's CPUs: each offers the CPUs configured here",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MailProg=/bin/true",
            "MpiDefault=none",
            "# a job gets slurmd's locked-memory limit, not the submitting shell's",
            "PropagateResourceLimitsExcept=MEMLOCK",
            "# the prolog runs when the job is allocated, on every node; a job whose prolog "
            "failed is requeued, not held",
            "PrologFlags=Alloc",
            "SchedulerParameters=nohold_on_prolog_fail",
            *([f"Prolog={settings.prolog}"] if settings.prolog else []),
            *([f"Epilog={settings.epilog}"] if settings.epilog else []),
            "GresTypes=gpu",
            f"HealthCheckProgram={HEALTH_CHECK_PROGRAM}",
            f"HealthCheckInterval={settings.health_check_interval}",
            "HealthCheckNodeState=ANY",
            *(f"NodeName={n.name} NodeAddr={n.address} CPUs={settings.cpus}{gres} "
              "State=UNKNOWN" for n in nodes),
        ]
        if nodes:
            lines.append(f"PartitionName={PARTITION} Nodes={','.join(n.name for n in nodes)} "
                         "Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _start_munged(self) -> None:
        if self._pid("munged") is not None:
            return
        munge = self.dir / "munge"
        self.munge_socket.unlink(missing_ok=True)
        localcmd.run(["munged", f"--socket={self.munge_socket}",
                      f"--key-file={munge / 'munge.key'}",
                      f"--pid-file={self._pidfile('munged')}",
                      f"--log-file={self.dir / 'log' / 'munged.log'}",
                      f"--seed-file={munge / 'munged.seed'}"], timeout=30)
        self._wait(self.munge_socket.exists, "munged did not create its socket",
                   self.dir / "log" / "munged.log")

    def _start_slurmctld(self) -> None:
        etc = self.dir / "etc"
        q = shlex.quote
        script = (f"mount --bind {q(str(etc / 'hosts'))} /etc/hosts && "
                  f"hostname {q(self.controller_name)} && exec slurmctld -f {q(str(self.conf))}")
        localcmd.run(["unshare", "--mount", "--uts", "--propagation", "private",
                      "sh", "-ec", script], timeout=60)
        self._wait(self._slurmctld_answers, "slurmctld does not answer",
                   self.dir / "log" / "slurmctld.log")

    def _slurmctld_answers(self) -> bool:
        try:
            return "is UP" in self.client.run(["scontrol", "ping"])
        except SlurmError:
            return False

    def _start_slurmd(self, node: Node, memlock_kib: int | None = None) -> None:
        """Start the node's slurmd with the controller's locked-memory limit (the lab cannot
        raise it: it runs without CAP_SYS_RESOURCE), or lowered to ``memlock_kib``."""
        if self._pid("slurmd", node.name) is not None:
            return
        q = shlex.quote
        memlock = "" if memlock_kib is None else f" && ulimit -l {int(memlock_kib)}"
        script = (f"mkdir -p /etc/slurm && ln -sfn {q(str(self.conf))} /etc/slurm/slurm.conf"
                  f"{memlock} && exec slurmd -f {q(str(self.conf))} -N {q(node.name)}")
        localcmd.run([*node.nsenter(), "sh", "-ec", script], timeout=60)
        self._wait(lambda: self._pid("slurmd", node.name) is not None,
                   f"{node.name}: slurmd did not start", self.dir / "log" /
                   f"slurmd-{node.name}.log")

    def restart_slurmd(self, node: Node, memlock_kib: int | None = None) -> None:
        """Restart the node's slurmd, its locked-memory limit lowered to ``memlock_kib`` KiB
        (systemd's default for a unit is 8 MiB, older ones' 64 KiB) or the controller's, and
        wait until it registers."""
        pid = self._pid("slurmd", node.name)
        if pid is not None:
            self._stop_pids([pid])
        self._start_slurmd(node, memlock_kib)
        self._wait_registered([node.name])

    def _wait_registered(self, names: list[str]) -> None:
        """Wait until slurmctld has heard from every node's slurmd."""
        pending: list[str] = list(names)

        def registered() -> bool:
            nonlocal pending
            try:
                known = {n.name: n for n in self.client.nodes()}
            except SlurmError:
                return False
            pending = [n for n in names if n not in known or known[n].base_state == "UNKNOWN"
                       or "NOT_RESPONDING" in known[n].flags]
            return not pending

        self._wait(registered, f"slurmd did not register with slurmctld: {', '.join(pending)}",
                   self.dir / "log")

    @staticmethod
    def _wait(ready: Callable[[], bool], problem: str, log: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            if time.monotonic() > deadline:
                raise LabError(f"{problem} within {START_TIMEOUT:.0f}s (see {log})")
            time.sleep(0.1)

    # ---- inspect ---------------------------------------------------------------------

    def status(self) -> SlurmStatus:
        """Daemons and node states; slurmctld's answer or why there is none."""
        names = self.settings().nodes
        nodes: list[SlurmNode] = []
        error = None
        try:
            nodes = self.client.nodes()
        except SlurmError as exc:
            error = str(exc)
        return SlurmStatus(self._pid("munged"), self._pid("slurmctld"),
                           {n: self._pid("slurmd", n) for n in names}, nodes, error, self.conf)

    # ---- stop ------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every slurmd, slurmctld and munged of the lab and delete its Slurm state."""
        self._stop_daemons()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _stop_daemons(self) -> None:
        self._stop_pids(self._processes())

    def _stop_pids(self, pids: Iterable[int]) -> None:
        """SIGTERM, then SIGKILL after 5 s; each pid is checked to still be one of this lab's
        Slurm daemons right before it is signalled."""
        pids = list(pids)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                argv = _cmdline(pid)
                if argv and Path(argv[0]).name in DAEMONS and str(self.dir) in " ".join(argv):
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        continue
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                pids = [p for p in pids if _alive(p)]
                if not pids:
                    return
                time.sleep(0.05)


def _gpu_device(path: Path, index: int) -> None:
    """A character device with the numbers of /dev/nvidiaN (major 195): slurmd gives a job
    the GPUs of its gres.conf only when each File= is a device, and sets the job's
    SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES from them. Without the driver, opening it fails."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISCHR(path.lstat().st_mode):
            return
        path.unlink()
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(195, index))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1]
    except (OSError, IndexError):
        return False
    return not state.startswith("Z")
