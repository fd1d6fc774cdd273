"""The node program's Slurm prolog and epilog: the job's GPUs checked before the job, cleaned
and compared after it, the node drained with ``gf prolog/...`` or ``gf epilog/...``.

The program runs as slurmd runs it, with stand-ins for nvidia-smi, dmesg and scontrol (the
health check's, tests/unit/test_slurm_healthcheck.py). The leftover processes are real
child processes; an unkillable one is a pid nvidia-smi lists that does not exist here (a
process of another PID namespace). No real capture of ``--query-compute-apps`` is in the
fixtures yet: the stand-in prints nvidia-smi's documented CSV (``gpu_bus_id, pid,
used_memory`` with ``noheader,nounits``).
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.inventory.load import load_inventory
from gpufleet.node import healthcheck as program
from gpufleet.provision.role import RoleVars
from gpufleet.roles import slurm_healthcheck
from tests.conftest import FIXTURES
from tests.unit.test_slurm_healthcheck import SMI, Node, _drained, _lines, _script

# The H200 of tests/fixtures as the prolog's and epilog's query (JOB_QUERY) shows it: index,
# bus, name, ECC and row remapping from h200_nvidia_smi_query.txt, the uuid from
# nvidia/h200x1_query_gpu_csv_units.txt, memory.used from h200x1_query_gpu_csv_units_memory.txt,
# the application clocks, compute mode and MIG mode from nvidia/h200x1_q.txt (nounits).
H200 = {"index": "0", "pci.bus_id": "00000000:00:06.0", "name": "NVIDIA H200",
        "ecc.errors.uncorrected.volatile.total": "0", "remapped_rows.pending": "No",
        "remapped_rows.failure": "No", "uuid": "GPU-3580d2be-4a95-b601-ccda-465f675e3c88",
        "memory.used": "0", "clocks.applications.graphics": "1980",
        "clocks.applications.memory": "3201", "compute_mode": "Default",
        "mig.mode.current": "Disabled"}
SECOND = {**H200, "index": "1", "pci.bus_id": "00000000:00:07.0",
          "uuid": "GPU-00000000-0000-0000-0000-000000000001"}
JOB = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0", "SLURMD_NODENAME": "node04",
       "SLURM_JOB_USER": "alice"}


def _csv(rows: list[dict[str, str]]) -> str:
    keys = program.JOB_QUERY.split(",")
    return "".join(", ".join(row[k] for k in keys) + "\n" for row in rows)


class JobNode(Node):
    """The health check's stand-ins, and an nvidia-smi that answers the prolog's and
    epilog's GPU query (gpus.csv) and lists compute processes: those of live.txt while they
    run (a process not yet reaped is gone), those of always.txt always."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.state = tmp / "state"
        self.job_smi = tmp / "gpus.csv"
        self.live = tmp / "live.txt"
        self.always = tmp / "always.txt"
        self.set_gpus([H200, SECOND])
        self.live.write_text("")
        self.always.write_text("")
        _script(self.bin, "nvidia-smi", f"""case "$*" in
*--query-compute-apps*)
  while IFS=', ' read -r bus pid used; do
    st=$(cut -d' ' -f3 /proc/$pid/stat 2>/dev/null)
    [ -n "$st" ] && [ "$st" != Z ] && echo "$bus, $pid, $used"
  done < {self.live}
  cat {self.always};;
*memory.used*) cat {self.job_smi};;
*) cat {self.smi};;
esac
""")
        self.write_job_config()

    def set_gpus(self, rows: list[dict[str, str]]) -> None:
        self.job_smi.write_text(_csv(rows))

    def write_job_config(self, **values: object) -> None:
        self.write_config(**{"gpu_count": 1, "state_dir": str(self.state), "fabric_ports": [],
                             "job_memlock_min_kib": 64, "epilog_kill_grace_s": 1, **values})

    def job(self, context: str, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        return self.run("--context", context, *args, env={**JOB, **(env or {})})

    def record(self, job: str = "42") -> Path:
        return self.state / "jobs" / f"{job}.json"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[JobNode]:
    stand_ins = JobNode(tmp_path)
    yield stand_ins
    stand_ins.close()


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts as a job's leftovers; any still running at the end is
    killed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _leftover(children: list[subprocess.Popen[bytes]], ignore_term: bool = False
              ) -> subprocess.Popen[bytes]:
    trap = "trap '' TERM; " if ignore_term else ""
    proc = subprocess.Popen(["sh", "-c", f"{trap}exec sleep 60"])
    children.append(proc)
    time.sleep(0.1)  # the shell has become sleep
    return proc


def _absent_pid() -> int:
    """A pid no process here has: what nvidia-smi lists for a process of another PID
    namespace."""
    for pid in range(int(Path("/proc/sys/kernel/pid_max").read_text()) - 1, 1000, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    raise AssertionError("no free pid")


def _seconds(proc: subprocess.CompletedProcess[str]) -> float:
    """The time the program reports it took (the summary line's), which leaves out the
    interpreter's start (over a second on a loaded test machine, milliseconds on a node)."""
    return float(proc.stdout.splitlines()[-1].rsplit(" in ", 1)[1].rstrip("s"))


def _reason(node: JobNode) -> str:
    [update] = node.updates()
    assert update[:3] == ["update", "nodename=node04", "state=drain"]
    return update[3].removeprefix("reason=")


# ---- the context, the job, the parsers -------------------------------------------------------

def test_the_context_comes_from_the_option_else_the_name_run_by() -> None:
    assert program.context_of(None, "/usr/local/sbin/gpufleet-prolog") == "prolog"
    assert program.context_of(None, "gpufleet-epilog") == "epilog"
    assert program.context_of(None, "/usr/local/sbin/gpufleet-healthcheck") == "periodic"
    assert program.context_of("epilog", "/usr/local/sbin/gpufleet-prolog") == "epilog"
    periodic = [c.name for c in program.CATALOGUE if "periodic" in c.contexts]
    assert periodic == ["gpus", "ecc", "xid", "driver", "nccl", "port_range", "watch",
                        "time_sync", "roce_qos"]
    assert [c.name for c in program.CATALOGUE if "prolog" in c.contexts] == [
        "gpus", "gpu_processes", "ecc", "xid", "fabric_ports", "memlock", "gpu_config"]
    assert [c.name for c in program.CATALOGUE if "epilog" in c.contexts] == [
        "gpu_processes", "gpu_memory", "gpu_config"]


def test_the_job_comes_from_slurmds_environment() -> None:
    assert program.job_from_env({"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,1",
                                 "CUDA_VISIBLE_DEVICES": "5"}) == program.Job("42", ("0", "1"))
    assert program.job_from_env({"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "GPU-ab, 3"}) \
        == program.Job("7", ("GPU-ab", "3"))
    assert program.job_from_env({"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "NoDevFiles"}) \
        == program.Job("7", ())
    assert program.job_from_env({"SLURM_JOB_ID": "../../etc/x"}) == program.Job(None, ())


def test_parse_compute_apps_in_the_documented_csv() -> None:
    text = "00000000:3B:00.0, 4242, 1024\n0000:3b:00.0, 4243, [N/A]\n\n"
    assert program.parse_compute_apps(text) == [program.App("0000:3b:00.0", 4242, "1024"),
                                                program.App("0000:3b:00.0", 4243, "[N/A]")]
    assert program.parse_compute_apps("") == []
    assert program.parse_compute_apps("No running processes found\n") == []
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        program.parse_compute_apps("00000000:3B:00.0, python3, 1024\n")
    assert program.bus_id("00000000:3B:00.0") == program.bus_id("0000:3b:00.0")


def test_xid_stamps_from_dmesg_journalctl_and_syslog() -> None:
    dmesg = program.parse_xid_events((FIXTURES / "samples" / "synthetic_dmesg_xid.txt")
                                     .read_text())
    assert dmesg[0].stamp == 8123.441257 and dmesg[0].line.startswith("NVRM: Xid (PCI:0000:18")
    syslog = program.parse_xid_events((FIXTURES / "nvidia" / "syslog_xid13_relion436.txt")
                                      .read_text())
    assert syslog[0].stamp == 82659.755847
    dated = program.parse_xid_events((FIXTURES / "nvidia" / "dmesg_T_xid_akash244.txt")
                                     .read_text())
    assert dated and {e.stamp for e in dated} == {None}


def test_new_xid_events_are_those_after_the_newest_seen() -> None:
    events = program.parse_xid_events((FIXTURES / "samples" / "synthetic_dmesg_xid.txt")
                                      .read_text())
    fourth = {"stamp": events[3].stamp, "line": events[3].line}
    assert program.new_xid_events(events, {}, "boot-a") == events
    assert program.new_xid_events(events, {"boot_id": "boot-a", "xid": fourth},
                                  "boot-a") == events[4:]
    assert program.new_xid_events(events, {"boot_id": "boot-b", "xid": fourth},
                                  "boot-a") == events
    rotated = {"stamp": events[3].stamp, "line": "NVRM: Xid (PCI:0000:99:00): 79, gone"}
    assert program.new_xid_events(events, {"boot_id": "boot-a", "xid": rotated},
                                  "boot-a") == [e for e in events if e.stamp is None
                                                or e.stamp > (events[3].stamp or 0)]
    unstamped = {"stamp": None, "line": "NVRM: Xid (PCI:0000:99:00): 79, gone"}
    assert program.new_xid_events(events, {"boot_id": "boot-a", "xid": unstamped},
                                  "boot-a") == events


# ---- state files -----------------------------------------------------------------------------

def test_state_files_are_written_atomically_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "state" / "gate.json"
    assert program.read_state(str(path)) == ({}, "absent")
    program.write_state(str(path), {"boot_id": "b", "xid": {"stamp": 1.5, "line": "x"}})
    assert program.read_state(str(path)) == ({"boot_id": "b",
                                              "xid": {"stamp": 1.5, "line": "x"}}, "")
    assert os.listdir(path.parent) == ["gate.json"]
    path.write_text('{"boot_id": "b", "xid": {"st')
    assert program.read_state(str(path)) == ({}, "corrupt, read as empty")
    path.write_text('["b"]')
    assert program.read_state(str(path)) == ({}, "not a JSON object, read as empty")
    path.write_text(json.dumps({"pad": "x" * program.STATE_LIMIT}))
    assert program.read_state(str(path)) == ({}, "over 65536 bytes, read as empty")
    with pytest.raises(OSError, match="more than 65536"):
        program.write_state(str(path), {"pad": "x" * program.STATE_LIMIT})
    assert os.listdir(path.parent) == ["gate.json"]


def test_job_records_are_pruned_oldest_first(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(program, "JOBS_MOST", 3)
    for job in range(5):
        record = tmp_path / f"{job}.json"
        record.write_text("{}")
        os.utime(record, (1000 + job, 1000 + job))
    program.prune_records(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2.json", "3.json", "4.json"]


# ---- checks on their own ---------------------------------------------------------------------

def _run(context: str = "prolog", **config: Any) -> program.Run:
    return program.Run(context, {**program.DEFAULTS, **config}, program.Deadline(5),
                       program.Job("42", ("0",)))


def test_fabric_ports_are_active(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys_ib = tmp_path / "infiniband"
    monkeypatch.setattr(program, "INFINIBAND_DIR", str(sys_ib))
    assert program.check_fabric_ports(_run()).line() == (
        f"SKIP fabric_ports: no InfiniBand/RoCE port in {sys_ib}")
    for device, port, state in (("mlx5_0", "1", "4: ACTIVE"), ("mlx5_1", "1", "1: DOWN"),
                                ("mlx5_1", "2", "4: ACTIVE")):
        (sys_ib / device / "ports" / port).mkdir(parents=True, exist_ok=True)
        (sys_ib / device / "ports" / port / "state").write_text(state + "\n")
    assert program.check_fabric_ports(_run()).line() == (
        "FAIL fabric_ports: not ACTIVE: mlx5_1/1 DOWN")
    assert program.check_fabric_ports(_run(fabric_ports=["mlx5_0/1", "mlx5_1/2"])).line() == (
        "PASS fabric_ports: 2 port(s) ACTIVE: mlx5_0/1, mlx5_1/2")
    assert program.check_fabric_ports(_run(fabric_ports=["mlx5_2/1"])).line() == (
        "FAIL fabric_ports: not ACTIVE: mlx5_2/1 absent")


def test_memlock_must_be_unlimited_or_the_configured_least(
        monkeypatch: pytest.MonkeyPatch) -> None:
    infinity = resource.RLIM_INFINITY
    monkeypatch.setattr(program.resource, "getrlimit", lambda _: (65536, infinity))
    assert program.check_memlock(_run()).line() == (
        "FAIL memlock: 64 KiB (hard limit unlimited), unlimited needed: slurmd's limit, "
        "which jobs get")
    assert program.check_memlock(_run(job_memlock_min_kib=64)).line() == (
        "PASS memlock: 64 KiB, at least 64 KiB")
    assert program.check_memlock(_run(job_memlock_min_kib=65)).status == "FAIL"
    monkeypatch.setattr(program.resource, "getrlimit", lambda _: (infinity, infinity))
    assert program.check_memlock(_run()).line() == "PASS memlock: unlimited"


def test_the_epilog_never_signals_pid_1_or_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(program.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    listed = [program.App("0000:00:06.0", pid, "10") for pid in (1, os.getpid(), 4242)]
    run = _run("epilog", epilog_kill_grace_s=0)
    monkeypatch.setattr(run, "apps", lambda: listed)
    result = program._kill_leftovers(run, [H200])
    assert sent == [(4242, signal.SIGTERM), (4242, signal.SIGKILL)]
    assert result.status == "FAIL" and run.left_behind
    assert result.message.startswith("cannot kill pid 1 (")
    assert "on GPU0 00000000:00:06.0: not signalled; pid " in result.message
    assert result.message.endswith("on GPU0 00000000:00:06.0: still listed after SIGKILL")


# ---- the prolog, as slurmd runs it -----------------------------------------------------------

def test_a_healthy_prolog_passes_records_the_gpus_and_asks_slurm_nothing(node: JobNode) -> None:
    """Run by the name slurm.conf's Prolog= gives it (no arguments)."""
    link = node.tmp / "gpufleet-prolog"
    link.symlink_to(Path(program.__file__))
    proc = subprocess.run([sys.executable, str(link), "--config", str(node.config)],
                          capture_output=True, text=True, timeout=30, check=False,
                          env={"PATH": f"{node.bin}:/usr/bin:/bin", **JOB})
    assert _seconds(proc) < 5
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = _lines(proc)
    assert list(lines) == ["gpus", "gpu_processes", "ecc", "xid", "fabric_ports", "memlock",
                           "gpu_config"]
    assert lines["gpus"] == "PASS gpus: job 42's 1 GPU(s): GPU0 00000000:00:06.0"
    assert lines["gpu_processes"] == "PASS gpu_processes: no compute process on job 42's 1 GPU(s)"
    assert lines["xid"] == "PASS xid: no new Xid that drains (0 new Xid event(s), 0 since boot)"
    assert lines["gpu_config"] == ("PASS gpu_config: 1 GPU(s) recorded for the epilog: GPU0 "
                                   "00000000:00:06.0 clocks 1980/3201 MHz, compute mode "
                                   "Default, MIG Disabled")
    record = json.loads(node.record().read_text())
    assert record["gpus"] == {"0000:00:06.0": {
        "index": "0", "clocks.applications.graphics": "1980",
        "clocks.applications.memory": "3201", "compute_mode": "Default",
        "mig.mode.current": "Disabled"}}
    assert not node.calls.exists(), "a passing prolog asks slurmctld nothing"
    assert proc.stdout.splitlines()[-1].startswith("prolog node04 job 42: 0 failed, 6 passed, "
                                                   "1 skipped in ")
    [logged] = node.syslog()
    assert logged.startswith("<30>gpufleet-prolog[")


def test_the_roles_wrappers_run_the_program_as_prolog_and_epilog(node: JobNode) -> None:
    """What slurmd runs: Prolog=/Epilog= name the wrappers, which take no arguments."""
    sbin = node.tmp / "sbin"
    sbin.mkdir()
    hosts = node.tmp / "hosts.yml"
    hosts.write_text("all:\n  hosts:\n    gpu01:\n      slurm_healthcheck: true\n"
                     "      slurm_prolog: true\n      slurm_epilog: true\n"
                     f"      slurm_healthcheck_python: {sys.executable}\n"
                     f"      slurm_healthcheck_path: {sbin}/gpufleet-healthcheck\n"
                     f"      slurm_healthcheck_config: {node.config}\n"
                     f"      slurm_prolog_path: {sbin}/gpufleet-prolog\n"
                     f"      slurm_epilog_path: {sbin}/gpufleet-epilog\n")
    role = slurm_healthcheck.ROLE
    v = RoleVars(load_inventory(hosts).hosts["gpu01"], role.defaults)
    role.check(v)
    for path, text in ((sbin / "gpufleet-healthcheck", role.program(v)),
                       (sbin / "gpufleet-prolog", role.wrapper(v, "prolog")),
                       (sbin / "gpufleet-epilog", role.wrapper(v, "epilog"))):
        path.write_text(text)
        path.chmod(0o755)
    environment = {"PATH": f"{node.bin}:/usr/bin:/bin", **JOB}
    prolog = subprocess.run([str(sbin / "gpufleet-prolog")], capture_output=True, text=True,
                            timeout=30, check=False, env=environment)
    assert prolog.returncode == 0, prolog.stdout + prolog.stderr
    assert prolog.stdout.splitlines()[-1].startswith("prolog node04 job 42: 0 failed, 6 passed")
    assert node.record().exists()
    epilog = subprocess.run([str(sbin / "gpufleet-epilog")], capture_output=True, text=True,
                            timeout=30, check=False, env=environment)
    assert epilog.returncode == 0, epilog.stdout + epilog.stderr
    assert "PASS gpu_config: as the prolog recorded on 1 GPU(s)" in epilog.stdout
    assert not node.record().exists()


def test_a_job_without_gpus_skips_the_gpu_checks(node: JobNode) -> None:
    proc = node.job("prolog", env={"SLURM_JOB_GPUS": ""})
    assert proc.returncode == 0
    lines = _lines(proc)
    for check in ("gpus", "gpu_processes", "ecc", "gpu_config"):
        assert lines[check] == f"SKIP {check}: job 42 has no GPUs"
    assert not node.record().exists()


def test_a_process_on_the_jobs_gpu_fails_the_prolog_and_drains(
        node: JobNode, children: list[subprocess.Popen[bytes]]) -> None:
    mine, other = _leftover(children), _leftover(children)
    node.live.write_text(f"00000000:00:06.0, {mine.pid}, 1024\n"
                         f"00000000:00:07.0, {other.pid}, 512\n")
    proc = node.job("prolog")
    assert proc.returncode == 1
    message = (f"compute process(es) on the job's GPUs: pid {mine.pid} (sleep, 1024 MiB) on "
               "GPU0 00000000:00:06.0")
    assert _lines(proc)["gpu_processes"] == f"FAIL gpu_processes: {message}"
    reason = _reason(node)
    assert re.fullmatch(rf"gf prolog/gpu_processes: {re.escape(message)} "
                        r"\{gf1 p:gpu_processes@\d+\}", reason), reason
    assert f"slurm: drained node04: {reason}" in proc.stdout
    assert mine.poll() is None and other.poll() is None, "the prolog kills nothing"
    [logged] = node.syslog()
    assert logged.startswith("<27>gpufleet-prolog[") and "FAIL gpu_processes" in logged
    node.set_gpus([H200, SECOND])
    assert node.job("prolog", env={"SLURM_JOB_GPUS": "1"}).returncode == 1
    assert node.job("prolog", env={"SLURM_JOB_GPUS": "", "CUDA_VISIBLE_DEVICES": SECOND["uuid"]}
                    ).returncode == 1


def test_a_missing_gpu_or_ecc_errors_on_the_jobs_gpus_fail_the_prolog(node: JobNode) -> None:
    proc = node.job("prolog", env={"SLURM_JOB_GPUS": "0,3"})
    assert _lines(proc)["gpus"] == ("FAIL gpus: job 42's GPU(s) 3 not found (nvidia-smi lists 2 "
                                    "GPU(s))")
    assert _reason(node).startswith("gf prolog/gpus: job 42's GPU(s) 3 not found")
    node.set_gpus([H200, {**SECOND, "ecc.errors.uncorrected.volatile.total": "2",
                          "remapped_rows.pending": "Yes"}])
    assert _lines(node.job("prolog"))["ecc"] == "PASS ecc: no uncorrectable ECC error on 1 GPU(s)"
    assert _lines(node.job("prolog", env={"SLURM_JOB_GPUS": "1"}))["ecc"] == (
        "FAIL ecc: GPU1 00000000:00:07.0: 2 uncorrectable ECC error(s); GPU1 00000000:00:07.0: "
        "row remapping pending")


def test_the_prolog_fails_only_for_an_xid_that_drains_newer_than_the_last_one_it_saw(
        node: JobNode) -> None:
    node.dmesg.write_text((FIXTURES / "samples" / "synthetic_dmesg_xid.txt").read_text())
    first = node.job("prolog", "--no-drain")
    assert _lines(first)["xid"] == ("FAIL xid: new since the last prolog: Xid 79 on 0000:db:00 "
                                    "(GPU has fallen off the bus): RESTART_BM [reboot] (+5 more)")
    gate = json.loads((node.state / "gate.json").read_text())
    assert gate["xid"] == {"stamp": None, "line": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has "
                                                  "fallen off the bus."}
    assert _lines(node.job("prolog", "--no-drain"))["xid"] == (
        "PASS xid: no new Xid that drains (0 new Xid event(s), 11 since boot)")
    with node.dmesg.open("a") as log:
        log.write("[14001.000001] NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics\n")
    assert _lines(node.job("prolog", "--no-drain"))["xid"] == (
        "PASS xid: no new Xid that drains (1 new Xid event(s), 12 since boot)")
    with node.dmesg.open("a") as log:
        log.write("[14002.000001] NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has "
                  "fallen off the bus.\n")
    assert _lines(node.job("prolog", "--no-drain"))["xid"] == (
        "FAIL xid: new since the last prolog: Xid 79 on 0000:18:00 (GPU has fallen off the "
        "bus): RESTART_BM [reboot]")


def test_the_prolog_counts_the_repeats_it_saw_before(node: JobNode) -> None:
    """The third burst of an application Xid on one GPU within an hour drains, though the
    prolog saw (and passed) the first two."""
    def xid13(at: float) -> str:
        return f"[{at:.6f}] NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics\n"

    node.dmesg.write_text(xid13(100) + xid13(100.5) + xid13(700))
    assert _lines(node.job("prolog", "--no-drain"))["xid"].startswith("PASS xid: ")
    with node.dmesg.open("a") as log:
        log.write(xid13(1300))
    assert _lines(node.job("prolog", "--no-drain"))["xid"] == (
        "FAIL xid: new since the last prolog: Xid 13 on 0000:18:00 (Graphics Engine "
        "Exception): RESTART_APP [reset: 3 times in 1 h on this GPU]")


def test_the_prolog_takes_xid_154s_recovery_action(node: JobNode) -> None:
    """Real lines: an Xid 62 the catalogue resets, then the Xid 154 asking for the same."""
    node.dmesg.write_text((FIXTURES / "nvidia" / "journal_xid62_154_okm1045.txt").read_text())
    assert _lines(node.job("prolog", "--no-drain"))["xid"] == (
        "FAIL xid: new since the last prolog: Xid 62 on 0000:01:00 (Internal micro-controller "
        "halt): RESET_GPU [reset] (+2 more)")


@pytest.mark.parametrize(("content", "why"), [
    ('{"boot_id": "x", "xid": {"stamp', "corrupt, read as empty"),
    (json.dumps({"pad": "x" * 70000}), "over 65536 bytes, read as empty"),
])
def test_a_bad_gate_file_costs_only_its_history(node: JobNode, content: str, why: str) -> None:
    node.dmesg.write_text((FIXTURES / "samples" / "synthetic_dmesg_xid.txt").read_text())
    node.job("prolog", "--no-drain")
    (node.state / "gate.json").write_text(content)
    xid = _lines(node.job("prolog", "--no-drain"))["xid"]
    assert xid.startswith("FAIL xid: new since the last prolog: Xid 79 on 0000:db:00")
    assert xid.endswith(f"(+5 more); {node.state / 'gate.json'} {why}")
    assert _lines(node.job("prolog", "--no-drain"))["xid"].startswith("PASS xid: no new ")


def test_a_hung_nvidia_smi_keeps_the_prolog_within_its_budget_and_drains(
        node: JobNode) -> None:
    _script(node.bin, "nvidia-smi", "exec sleep 60\n")
    node.write_job_config(prolog_budget_s=5)
    started = time.monotonic()
    proc = node.job("prolog")
    # the program's own clock keeps the budget; the wall clock adds its interpreter's start,
    # seconds on a loaded machine, and stays far below the 60 s nvidia-smi would hang
    assert _seconds(proc) < 5 and time.monotonic() - started < 5 + 5
    lines = _lines(proc)
    assert lines["gpus"] == "FAIL gpus: nvidia-smi did not answer within 3.0s"
    assert lines["gpu_processes"] == "SKIP gpu_processes: no GPU data"
    assert proc.returncode == 1
    assert _reason(node).startswith("gf prolog/gpus: nvidia-smi did not answer within 3.0s "
                                    "(+1 more) {gf1 p:gpus@")


def test_the_prolog_adds_its_finding_and_never_resumes(node: JobNode) -> None:
    conformance = "gf gpu/health: ECC {gf1 c:gpu/health@1764590000}"
    _drained(node, "scontrol_show_node.txt", "node04", conformance)
    node.job("prolog", env={"SLURM_JOB_GPUS": "0,3"})
    assert _reason(node).startswith("gf gpu/health: ECC (+1 more) {gf1 c:gpu/health@1764590000 "
                                    "p:gpus@")
    _drained(node, "scontrol_show_node.txt", "node04",
             "gf prolog/gpus: lost {gf1 p:gpus@1764590000}")
    assert node.job("prolog").returncode == 0
    assert len(node.updates()) == 1, "a passing prolog does not clear its finding"


def test_the_health_check_clears_the_prologs_findings_of_the_checks_it_runs(
        node: JobNode) -> None:
    _drained(node, "scontrol_show_node.txt", "node04",
             "gf prolog/ecc: GPU0: 2 errors {gf1 p:ecc@1764590000}")
    node.run("--drain")
    assert node.updates() == [["update", "nodename=node04", "state=resume"]]
    held = ("gf prolog/gpu_processes: pid 7 {gf1 p:gpu_processes@1764590000 "
            "e:gpu_processes@1764590001}")
    _drained(node, "scontrol_show_node.txt", "node04", held)
    proc = node.run("--drain")
    assert len(node.updates()) == 1
    assert f"slurm: node04 already drained: {held}" in proc.stdout


# ---- the epilog ------------------------------------------------------------------------------

def test_the_epilog_kills_the_jobs_leftovers_only_and_compares_the_record(
        node: JobNode, children: list[subprocess.Popen[bytes]]) -> None:
    assert node.job("prolog").returncode == 0
    polite, stubborn = _leftover(children), _leftover(children, ignore_term=True)
    other = _leftover(children)
    node.live.write_text(f"00000000:00:06.0, {polite.pid}, 1024\n"
                         f"00000000:00:06.0, {stubborn.pid}, 2048\n"
                         f"00000000:00:07.0, {other.pid}, 512\n")
    proc = node.job("epilog")
    assert proc.returncode == 0, proc.stdout
    lines = _lines(proc)
    assert list(lines) == ["gpu_processes", "gpu_memory", "gpu_config"]
    first, second = sorted([polite.pid, stubborn.pid])
    size = {polite.pid: 1024, stubborn.pid: 2048}
    assert lines["gpu_processes"] == (
        f"PASS gpu_processes: killed 2 leftover process(es): pid {first} (sleep, "
        f"{size[first]} MiB) on GPU0 00000000:00:06.0; pid {second} (sleep, {size[second]} "
        "MiB) on GPU0 00000000:00:06.0")
    assert polite.wait(timeout=5) == -signal.SIGTERM
    assert stubborn.wait(timeout=5) == -signal.SIGKILL
    assert other.poll() is None, "another job's process on another GPU is left alone"
    assert lines["gpu_memory"] == "PASS gpu_memory: at most 0 MiB used on 1 GPU(s) (limit 1024 MiB)"
    assert lines["gpu_config"] == "PASS gpu_config: as the prolog recorded on 1 GPU(s)"
    assert not node.record().exists()
    assert not node.calls.exists()
    assert proc.stdout.splitlines()[-1].startswith("epilog node04 job 42: 0 failed, 3 passed")


def test_a_process_the_epilog_cannot_kill_drains_the_node(node: JobNode) -> None:
    ghost = _absent_pid()
    node.always.write_text(f"00000000:00:06.0, {ghost}, 4096\n")
    proc = node.job("epilog")
    assert _seconds(proc) < 2 * 1 + 1  # two graces and the queries
    assert proc.returncode == 1
    lines = _lines(proc)
    message = (f"cannot kill pid {ghost} (4096 MiB) on GPU0 00000000:00:06.0: no such process "
               "here (another PID namespace?), still listed")
    assert lines["gpu_processes"] == f"FAIL gpu_processes: {message}"
    assert lines["gpu_memory"] == ("SKIP gpu_memory: processes left on the GPUs (see "
                                   "gpu_processes)")
    assert lines["gpu_config"].startswith("SKIP gpu_config: no record of job 42 (")
    assert re.fullmatch(rf"gf epilog/gpu_processes: {re.escape(message)} "
                        r"\{gf1 e:gpu_processes@\d+\}", _reason(node))
    [logged] = node.syslog()
    assert logged.startswith("<27>gpufleet-epilog[")


def test_memory_not_released_or_changed_settings_fail_the_epilog(node: JobNode) -> None:
    node.job("prolog")
    node.set_gpus([{**H200, "memory.used": "2048", "compute_mode": "Exclusive_Process",
                    "clocks.applications.graphics": "1410"}, SECOND])
    proc = node.job("epilog")
    lines = _lines(proc)
    assert lines["gpu_memory"] == ("FAIL gpu_memory: GPU0 00000000:00:06.0: 2048 MiB used (at "
                                   "most 1024 MiB once the job ended)")
    assert lines["gpu_config"] == (
        "FAIL gpu_config: GPU0 00000000:00:06.0: clocks.applications.graphics 1410, recorded "
        "1980, compute_mode Exclusive_Process, recorded Default")
    assert _reason(node).startswith("gf epilog/gpu_memory: GPU0 00000000:00:06.0: 2048 MiB used "
                                    "(at most 1024 MiB once the job ended) (+1 more) {gf1 "
                                    "e:gpu_memory@")
    assert not node.record().exists(), "the record goes whatever the epilog found"
    node.write_job_config(epilog_max_used_mib=4096)
    lines = _lines(node.job("epilog", "--no-drain"))
    assert lines["gpu_memory"].startswith("PASS gpu_memory: at most 2048 MiB used")
    assert lines["gpu_config"] == (f"SKIP gpu_config: no record of job 42 ({node.record()} "
                                   "absent)")


def test_a_job_gpu_gone_fails_the_epilog(node: JobNode) -> None:
    proc = node.job("epilog", env={"SLURM_JOB_GPUS": "0,3"})
    assert _lines(proc)["gpu_processes"] == ("FAIL gpu_processes: job 42's GPU(s) 3 not found "
                                             "by nvidia-smi")
    assert _reason(node).startswith("gf epilog/gpu_processes: job 42's GPU(s) 3 not found")


def test_a_corrupt_job_record_is_skipped_and_removed(node: JobNode) -> None:
    node.record().parent.mkdir(parents=True)
    node.record().write_text("{not json")
    assert _lines(node.job("epilog"))["gpu_config"] == (
        f"SKIP gpu_config: no record of job 42 ({node.record()} corrupt, read as empty)")
    assert not node.record().exists()


def test_a_hung_nvidia_smi_keeps_the_epilog_within_its_budget(node: JobNode) -> None:
    _script(node.bin, "nvidia-smi", "exec sleep 60\n")
    node.write_job_config(epilog_budget_s=4, nvidia_smi_timeout_s=10)
    started = time.monotonic()
    proc = node.job("epilog")
    assert _seconds(proc) < 4 and time.monotonic() - started < 4 + 2
    assert _lines(proc)["gpu_processes"] == ("FAIL gpu_processes: cannot list job 42's GPUs: "
                                             "nvidia-smi did not answer within 2.0s")
    assert _reason(node).startswith("gf epilog/gpu_processes: cannot list job 42's GPUs")


@pytest.mark.parametrize(("values", "error"), [
    ({"prolog_budget_s": 2}, "prolog_budget_s has a wrong type or value: 2"),
    ({"epilog_kill_grace_s": -1}, "epilog_kill_grace_s has a wrong type or value: -1"),
    ({"epilog_max_used_mib": 1.5}, "epilog_max_used_mib has a wrong type or value: 1.5"),
    ({"job_memlock_min_kib": True}, "job_memlock_min_kib has a wrong type or value: True"),
    ({"fabric_ports": ["mlx5_0"]}, r"fabric_ports has a wrong type or value: \['mlx5_0'\]"),
    ({"state_dir": "var/lib"}, "state_dir has a wrong type or value: 'var/lib'"),
])
def test_bad_job_settings_are_exit_2(node: JobNode, values: dict[str, object],
                                     error: str) -> None:
    node.write_job_config(**values)
    proc = node.job("prolog")
    assert proc.returncode == 2 and node.updates() == []
    assert re.search(error, proc.stderr), proc.stderr


def test_the_stand_in_row_is_the_real_query_row() -> None:
    """The stand-in's first five fields are the real H200 capture's."""
    (real,) = program.parse_gpus(SMI.read_text())
    assert {k: H200[k] for k in real} == real
