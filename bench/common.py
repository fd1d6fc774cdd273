"""Shared pieces of the benchmarks: the bench lab, the tools' venv, timed subprocesses."""

from __future__ import annotations

import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.lab.cluster import Lab
from gpufleet.lab.model import LabConfig

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_LAB_NAME = "gfbench"
# Outside the test labs' subnets (10.<GPUFLEET_TEST_NET + 0..6>, 10.78-10.84 by default) and
# fleet_scale.py's default lab (10.140).
DEFAULT_LAB_SUBNET = "10.141.0"
_NAME = re.compile(r"^gf[a-z0-9]{1,10}$")


def lab_config(env: Mapping[str, str]) -> LabConfig:
    """The bench's lab: name and subnet from ``GPUFLEET_BENCH_LAB`` and
    ``GPUFLEET_BENCH_SUBNET`` (the first three octets, ``10.141.0``), state in
    ``/srv/gpufleet-lab-<name without gf>``."""
    name = env.get("GPUFLEET_BENCH_LAB") or DEFAULT_LAB_NAME
    subnet = env.get("GPUFLEET_BENCH_SUBNET") or DEFAULT_LAB_SUBNET
    if not _NAME.match(name):
        raise SystemExit(f"GPUFLEET_BENCH_LAB must be gf and 1-10 lowercase letters or digits, "
                         f"got {name!r}")
    octets = subnet.split(".")
    if len(octets) != 3 or not all(o.isdigit() and int(o) <= 255 for o in octets):
        raise SystemExit(f"GPUFLEET_BENCH_SUBNET must be the lab's first three octets "
                         f"(10.141.0), got {subnet!r}")
    root = Path(f"/srv/gpufleet-lab-{name.removeprefix('gf')}")
    return LabConfig(name=name, root=root, subnet=subnet, inventory_dir=root / "inventory" / "lab")


BENCH_LAB = lab_config(os.environ)
INVOKE = Path(sys.executable).parent / "invoke"
TOOLS_VENV = Path("/srv/gpufleet-bench-venv")
TOOL_PINS = ("ansible-core==2.19.14", "pyinfra==3.10.0")
WORK = BENCH_LAB.root / "work"


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def bench_lab() -> Lab:
    """The bench's own lab, with the project's lab group_vars (the pinned stack)."""
    group_vars = BENCH_LAB.inventory_dir / "group_vars"
    source = ROOT / "inventory" / "lab" / "group_vars"
    if group_vars.exists():
        shutil.rmtree(group_vars)
    shutil.copytree(source, group_vars)
    return Lab(BENCH_LAB)


def node_names(count: int) -> list[str]:
    return [f"node{i:02d}" for i in range(1, count + 1)]


def limit_pattern(count: int) -> str:
    """An Ansible host pattern (understood by gpufleet too) for node01..nodeNN."""
    return ":".join(node_names(count))


def check_checkout() -> None:
    """gpufleet must be imported from this checkout, the code the bench measures (a venv
    installed from another checkout would plan with that one's roles)."""
    import gpufleet

    found = Path(gpufleet.__file__).resolve().parent.parent
    if found != ROOT:
        raise BenchError(f"gpufleet is imported from {found}, not from this checkout {ROOT}: "
                         f"run with PYTHONPATH={ROOT} or install this checkout into the venv")


def ensure_tools() -> dict[str, str]:
    """ansible-core and pyinfra in their own venv (never in the project's); their versions."""
    python = TOOLS_VENV / "bin" / "python"
    if not python.exists():
        log(f"creating {TOOLS_VENV}")
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(TOOLS_VENV)], check=True)
    wanted = {p.split("==")[0]: p.split("==")[1] for p in TOOL_PINS}
    versions = tool_versions()
    if any(versions.get(name) != version for name, version in wanted.items()):
        log(f"installing {', '.join(TOOL_PINS)} into {TOOLS_VENV}")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *TOOL_PINS], check=True)
        versions = tool_versions()
    return versions


def tool_versions() -> dict[str, str]:
    """Installed versions of the compared tools (empty entries when missing)."""
    python = TOOLS_VENV / "bin" / "python"
    found: dict[str, str] = {}
    if python.exists():
        script = ("import importlib.metadata as m\n"
                  "for d in ('ansible-core', 'pyinfra', 'paramiko'):\n"
                  "    try: print(d, m.version(d))\n"
                  "    except m.PackageNotFoundError: pass\n")
        out = subprocess.run([str(python), "-c", script], capture_output=True, text=True,
                             check=False).stdout
        found = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    from importlib import metadata

    found["gpufleet"] = metadata.version("gpufleet")
    found["gpufleet paramiko"] = metadata.version("paramiko")
    found["python"] = sys.version.split()[0]
    return found


@dataclass
class Timed:
    """One timed command: wall clock, CPU of the process tree it waited for, its output."""

    argv: list[str]
    rc: int
    wall_s: float
    cpu_s: float
    stdout: str
    stderr: str


def run_timed(argv: Sequence[str], *, env: dict[str, str] | None = None,
              cwd: Path | None = None, timeout: float = 900) -> Timed:
    """Run a command to completion; CPU is user+sys of it and the children it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run(list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=timeout,
                          check=False)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Timed(list(argv), proc.returncode, wall, cpu, proc.stdout, proc.stderr)


@dataclass
class Sample:
    """One measured run of one tool on one fleet size."""

    experiment: str
    tool: str
    nodes: int
    run: int
    wall_s: float
    cpu_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["wall_s"] = round(self.wall_s, 3)
        doc["cpu_s"] = round(self.cpu_s, 3)
        return doc


class BenchError(RuntimeError):
    """A tool did not report what a converged fleet must give; the timing is invalid."""


def fail(what: str, timed: Timed) -> BenchError:
    tail = (timed.stdout[-1500:] + "\n" + timed.stderr[-1500:]).strip()
    return BenchError(f"{what} (exit {timed.rc}):\n{tail}")


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def node_cpu_s(lab: Lab) -> float:
    """CPU seconds the lab's nodes spent in SSH sessions so far: user+sys of each node's
    sshd and of the children it reaped (every session and command it ran)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for node in lab.nodes():
        try:
            pid = int(node.sshd_pidfile.read_text().strip())
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        except (OSError, ValueError, IndexError):
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / tick
