"""gpufleet-healthcheck (the node-side program) and the slurm_healthcheck role that installs it.

The program runs as a subprocess with stand-ins for nvidia-smi, dmesg, journalctl,
dpkg-query and scontrol that replay output captured on a real H200 node
(tests/fixtures/slurm/h200_*) and on the lab's Slurm (tests/fixtures/slurm/scontrol_*).
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet import bootstrap
from gpufleet.errors import VarError
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import Facts
from gpufleet.inventory.load import load_inventory
from gpufleet.node import healthcheck as program
from gpufleet.node import watch as watcher
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles import slurm_healthcheck
from gpufleet.slurm import client, findings
from gpufleet.slurm.findings import Finding
from tests.conftest import FIXTURES, ROOT

SLURM = FIXTURES / "slurm"
PROGRAM = Path(program.__file__)
WATCH = Path(watcher.__file__)
SMI = SLURM / "h200_nvidia_smi_query.txt"
CHRONY = FIXTURES / "published" / "chronyc-n-tracking-4.3-debian12-loopback-server.txt"


# ---- the program's parts ---------------------------------------------------------------------

def test_program_needs_only_the_standard_library_and_python_3_9() -> None:
    tree = ast.parse(PROGRAM.read_text(), feature_version=(3, 9))
    roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module}
    assert roots - set(sys.stdlib_module_names) == set()


def test_no_site_critical_xids_by_default_and_the_state_file_is_the_engines() -> None:
    assert program.DEFAULTS["critical_xids"] == []
    assert program.DEFAULTS["state_file"] == bootstrap.STATE_FILE
    assert slurm_healthcheck.STATE_FILE == bootstrap.STATE_FILE


def test_parse_gpus_on_a_real_h200() -> None:
    (gpu,) = program.parse_gpus(SMI.read_text())
    assert gpu["name"] == "NVIDIA H200" and gpu["index"] == "0"
    assert program.ecc_result([gpu]).status == "PASS"
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        program.parse_gpus((SLURM / "h200_nvidia_smi_bad_field.txt").read_text())


def test_parse_xids() -> None:
    events = program.parse_xids((FIXTURES / "samples" / "synthetic_dmesg_xid.txt").read_text())
    assert [e[1] for e in events] == [13, 13, 31, 48, 63, 94, 64, 74, 95, 79, 79]
    assert events[3][0] == "0000:3a:00" and events[3][2].startswith("An uncorrectable double")
    assert program.parse_xids((SLURM / "h200_dmesg_nvrm.txt").read_text()) == []


def test_parse_port_range_and_slurm_node() -> None:
    sysctl = (FIXTURES / "h200x2" / "port_range.txt").read_text()
    assert program.parse_port_range(sysctl) == (32768, 60999)
    assert program.parse_port_range("49152-65535") == (49152, 65535)
    assert program.parse_slurm_node((SLURM / "scontrol_show_node_one.txt").read_text()) == \
        ("MIXED", None)
    assert program.parse_slurm_node((SLURM / "scontrol_show_node_comment.txt").read_text()) == \
        ("IDLE+DRAIN", "disk check [smartctl] = failing")


def test_versions_against_the_recorded_state(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    driver = tmp_path / "version"
    driver.write_text((SLURM / "h200_proc_driver_version.txt").read_text())
    monkeypatch.setattr(program, "DRIVER_VERSION_FILE", str(driver))
    monkeypatch.setattr(program, "installed_nccl", lambda deadline: "2.28.3-1+cuda13.0")
    deadline = program.Deadline(5)
    same = program.check_versions({"driver": "580.159.04", "nccl": "2.28.3-1+cuda13.0"},
                                  "node.json", deadline)
    assert [(r.check, r.status) for r in same] == [("driver", "PASS"), ("nccl", "PASS")]
    other = program.check_versions({"driver": "550.127.05", "nccl": "absent"}, "node.json",
                                   deadline)
    assert [r.line() for r in other] == ["FAIL driver: 580.159.04, recorded 550.127.05",
                                         "FAIL nccl: 2.28.3-1+cuda13.0, recorded absent"]
    none = program.check_versions(None, "/etc/gpufleet/node.json", deadline)
    assert {r.status for r in none} == {"SKIP"}


def test_port_range_against_config_then_recorded_state(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    live = tmp_path / "ip_local_port_range"
    live.write_text("32768\t60999\n")
    monkeypatch.setattr(program, "PORT_RANGE_FILE", str(live))
    config = dict(program.DEFAULTS, port_range="49152 65535")
    assert program.check_port_range(config, None).line() == \
        "FAIL port_range: 32768-60999, expected 49152-65535"
    recorded = {"port_range": "32768 60999"}
    assert program.check_port_range(program.DEFAULTS, recorded).status == "PASS"
    assert program.check_port_range(program.DEFAULTS, None).status == "SKIP"


# ---- the program, run as slurmd runs it ------------------------------------------------------

def _script(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


class Node:
    """A node's tools as stand-ins; ``run`` starts the program against them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.bin = tmp / "bin"
        self.bin.mkdir()
        self.smi = tmp / "smi.txt"
        self.smi.write_text(SMI.read_text())
        self.dmesg = tmp / "dmesg.txt"
        self.dmesg.write_text((SLURM / "h200_dmesg_nvrm.txt").read_text())
        self.show = tmp / "show.txt"
        self.show.write_text((SLURM / "scontrol_show_node_one.txt").read_text())
        self.calls = tmp / "scontrol.log"
        _script(self.bin, "nvidia-smi", f'cat {self.smi}\n')
        _script(self.bin, "dmesg", f'cat {self.dmesg}\n')
        _script(self.bin, "dpkg-query", "printf 'hi  2.28.3-1+cuda13.0'\n")
        _script(self.bin, "chronyc", f"cat {CHRONY}\n")
        record = ("python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\" >> "
                  f"{self.calls}\n")
        _script(self.bin, "scontrol", record + f'case "$1" in --oneliner) cat {self.show};; '
                                                'esac\n')
        self.config = tmp / "healthcheck.json"
        # the program's syslog socket: a short path (a socket's is at most 107 bytes)
        self.log_path = Path(tempfile.mkdtemp(prefix="gfhc-")) / "log"
        self.log = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.log.bind(str(self.log_path))
        self.write_config(gpu_count=1)

    def write_config(self, **values: object) -> None:
        self.config.write_text(json.dumps({"state_file": str(self.tmp / "node.json"),
                                           "syslog_socket": str(self.log_path), **values}))

    def syslog(self) -> list[str]:
        """The messages the program sent to syslog so far."""
        self.log.setblocking(False)
        found = []
        with contextlib.suppress(BlockingIOError):
            while True:
                found.append(self.log.recv(65536).decode())
        return found

    def close(self) -> None:
        self.log.close()
        shutil.rmtree(self.log_path.parent, ignore_errors=True)

    def run(self, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        environment = {"PATH": f"{self.bin}:/usr/bin:/bin", **(env or {})}
        return subprocess.run([sys.executable, str(PROGRAM), "--config", str(self.config),
                               "--node", "node04", *args], capture_output=True, text=True,
                              timeout=30, check=False, env=environment)

    def updates(self) -> list[list[str]]:
        if not self.calls.exists():
            return []
        calls = [json.loads(line) for line in self.calls.read_text().splitlines()]
        return [c for c in calls if c[0] == "update"]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    stand_ins = Node(tmp_path)
    yield stand_ins
    stand_ins.close()


def test_every_run_logs_its_verdict_to_syslog(node: Node) -> None:
    """facility daemon, tag gpufleet-healthcheck: err (27) when a check failed, info (30)
    when all passed, with the failures and what was done in Slurm."""
    assert node.run().returncode == 0
    [ok] = node.syslog()
    assert re.fullmatch(r"<30>gpufleet-healthcheck\[\d+\]: healthcheck node04: 0 failed, "
                        r"4 passed, 5 skipped in \d+\.\d+s", ok), ok
    node.write_config(gpu_count=2)
    assert node.run("--drain").returncode == 1
    [failed] = node.syslog()
    assert failed.startswith("<27>gpufleet-healthcheck[")
    assert "; FAIL gpus: 1 GPU(s) (NVIDIA H200), expected 2; slurm: drained node04: gf hc/gpus" \
        in failed


def test_without_a_syslog_socket_the_run_is_unchanged(node: Node) -> None:
    node.write_config(gpu_count=1, syslog_socket="/nonexistent/log")
    proc = node.run()
    assert proc.returncode == 0 and proc.stderr == ""


def _lines(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {line.split(":")[0].split()[-1]: line for line in proc.stdout.splitlines()
            if line.split()[0] in ("PASS", "FAIL", "SKIP")}


def test_a_healthy_node_passes_in_well_under_ten_seconds(node: Node) -> None:
    started = time.monotonic()
    proc = node.run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.monotonic() - started < 10
    lines = _lines(proc)
    assert lines["gpus"] == "PASS gpus: 1 GPU(s) (NVIDIA H200)"
    assert lines["ecc"] == "PASS ecc: no uncorrectable ECC error on 1 GPU(s)"
    assert lines["xid"] == "PASS xid: no Xid that drains since boot (0 Xid event(s) in all)"
    assert lines["driver"].startswith("SKIP driver: no recorded state")
    assert lines["time_sync"] == "PASS time_sync: +0.003 ms (chrony), within 100 ms"
    assert lines["roce_qos"].startswith("SKIP roce_qos: no RoCE QoS declared")
    assert list(lines) == ["gpus", "ecc", "xid", "driver", "nccl", "port_range",
                           "watch", "time_sync", "roce_qos"]
    assert proc.stdout.splitlines()[-1].startswith("healthcheck node04: 0 failed, 4 passed, "
                                                   "5 skipped in ")


def test_fewer_gpus_than_expected_fails(node: Node) -> None:
    node.write_config(gpu_count=2)
    proc = node.run()
    assert proc.returncode == 1
    assert _lines(proc)["gpus"] == "FAIL gpus: 1 GPU(s) (NVIDIA H200), expected 2"


def test_no_nvidia_smi_fails_only_where_gpus_are_expected(node: Node) -> None:
    (node.bin / "nvidia-smi").unlink()
    assert _lines(node.run())["gpus"] == "FAIL gpus: nvidia-smi not found; 1 GPU(s) expected"
    node.write_config()
    proc = node.run()
    assert proc.returncode == 0
    assert _lines(proc)["gpus"] == "SKIP gpus: no nvidia-smi and no GPUs expected"


def test_a_hung_nvidia_smi_is_cut_off_at_its_deadline(node: Node) -> None:
    _script(node.bin, "nvidia-smi", "exec sleep 60\n")
    node.write_config(gpu_count=1, nvidia_smi_timeout_s=1)
    started = time.monotonic()
    proc = node.run()
    assert time.monotonic() - started < 5
    assert _lines(proc)["gpus"] == "FAIL gpus: nvidia-smi did not answer within 1.0s"


def test_a_tool_that_does_not_end_when_killed_is_left_behind_within_the_budget(
        node: Node) -> None:
    """What a GPU tool stuck in the kernel does to a plain wait: its output stays open after
    SIGKILL (here a process of its own session, out of the kill's reach, holds it). The
    check still ends within its budget and names the tool as hung."""
    _script(node.bin, "nvidia-smi", "setsid sleep 60 &\nexec sleep 60\n")
    node.write_config(gpu_count=1, nvidia_smi_timeout_s=1, budget_s=6)
    started = time.monotonic()
    proc = node.run()
    assert time.monotonic() - started < 6
    assert _lines(proc)["gpus"] == ("FAIL gpus: nvidia-smi hung: did not answer within 1.0s, "
                                    "and did not end when killed")
    assert proc.returncode == 1
    subprocess.run(["pkill", "-f", "^sleep 60$"], check=False)


def test_the_checks_keep_to_their_budget_and_leave_time_to_drain(node: Node) -> None:
    _script(node.bin, "nvidia-smi", "exec sleep 60\n")
    node.write_config(gpu_count=1, nvidia_smi_timeout_s=4, budget_s=4)
    started = time.monotonic()
    proc = node.run("--drain")
    assert time.monotonic() - started < 4
    lines = _lines(proc)
    assert lines["gpus"] == "FAIL gpus: nvidia-smi did not answer within 1.0s"
    assert lines["xid"] == ("FAIL xid: kernel log unreadable: dmesg: not run: no time left "
                            "of 1s; journalctl: not run: no time left of 1s")
    [update] = node.updates()
    assert update[:3] == ["update", "nodename=node04", "state=drain"]
    assert re.fullmatch(r"reason=gf hc/gpus: nvidia-smi did not answer within 1\.0s \(\+1 "
                        r"more\) \{gf1 h:gpus@\d+ h:xid@\d+\}", update[3]), update[3]


def test_ecc_errors_and_xids_that_drain_fail(node: Node) -> None:
    row = SMI.read_text().strip().split(", ")
    row[3], row[4] = "3", "Yes"
    node.smi.write_text(", ".join(row) + "\n")
    node.dmesg.write_text((FIXTURES / "samples" / "synthetic_dmesg_xid.txt").read_text())
    lines = _lines(node.run())
    bus = row[1]
    assert lines["ecc"] == (f"FAIL ecc: GPU0 {bus}: 3 uncorrectable ECC error(s); "
                            f"GPU0 {bus}: row remapping pending")
    # 48, 64, 74, 95 need a reset and 79 twice a reboot; 13, 31 and 94 an application
    # restart, 63 nothing: the reboot comes first
    assert lines["xid"] == ("FAIL xid: Xid 79 on 0000:db:00 (GPU has fallen off the bus): "
                            "RESTART_BM [reboot] (+5 more)")


def test_application_xids_pass_until_one_repeats_or_the_site_lists_it(node: Node) -> None:
    log = "".join(f"[{at}] NVRM: Xid (PCI:0000:3b:00): 31, pid=9, name=python3, MMU Fault\n"
                  for at in (100.0, 100.2, 1900.0))
    node.dmesg.write_text(log)
    assert _lines(node.run())["xid"] == ("PASS xid: no Xid that drains since boot (3 Xid "
                                         "event(s) in all)")
    node.dmesg.write_text(log + "[3000.5] NVRM: Xid (PCI:0000:3b:00): 31, pid=9, MMU Fault\n")
    assert _lines(node.run())["xid"] == (
        "FAIL xid: Xid 31 on 0000:3b:00 (GPU memory page fault): RESTART_APP [reset: 3 times "
        "in 1 h on this GPU]")
    node.dmesg.write_text(log)
    node.write_config(critical_xids=[31])
    assert _lines(node.run())["xid"] == (
        "FAIL xid: Xid 31 on 0000:3b:00 (GPU memory page fault): RESTART_APP [application: in "
        "critical_xids] (+2 more)")


def test_an_unreadable_kernel_log_is_a_failure(node: Node) -> None:
    _script(node.bin, "dmesg", "echo 'dmesg: read kernel buffer failed: Operation not "
                               "permitted' >&2; exit 1\n")
    _script(node.bin, "journalctl", "echo 'No journal files were found.' >&2; exit 1\n")
    assert _lines(node.run())["xid"] == (
        "FAIL xid: kernel log unreadable: dmesg: dmesg: read kernel buffer failed: Operation "
        "not permitted; journalctl: No journal files were found.")


def test_drain_on_failure_names_the_first_failing_check(node: Node) -> None:
    node.write_config(gpu_count=2)
    _script(node.bin, "dmesg", "exit 1\n")
    _script(node.bin, "journalctl", "exit 1\n")
    proc = node.run("--drain")
    [update] = node.updates()
    reason = update[3].removeprefix("reason=")
    assert reason.startswith("gf hc/gpus: 1 GPU(s) (NVIDIA H200), expected 2 (+1 more) {gf1 "
                             "h:gpus@")
    assert f"slurm: drained node04: {reason}" in proc.stdout
    assert proc.returncode == 1


def test_run_by_slurmd_it_drains_without_the_flag_unless_told_not_to(node: Node) -> None:
    node.write_config(gpu_count=2)
    node.run(env={"SLURMD_NODENAME": "node04"})
    assert len(node.updates()) == 1
    node.run("--no-drain", env={"SLURMD_NODENAME": "node04"})
    assert len(node.updates()) == 1


def _drained(node: Node, fixture: str, name: str, reason: str) -> None:
    line = next(ln for ln in (SLURM / fixture).read_text().splitlines()
                if ln.startswith(f"NodeName={name} "))
    before = line.split(" State=")[1].split()[0]
    node.show.write_text(line.replace(f"State={before}", "State=IDLE+DRAIN")
                         .split(" Reason=")[0] + f" Reason={reason} [root@2026-12-01T09:55:09]")


def test_a_node_drained_by_someone_else_is_left_alone(node: Node) -> None:
    _drained(node, "scontrol_show_node.txt", "node04", "maintenance: replace PSU")
    node.write_config(gpu_count=2)
    proc = node.run("--drain")
    assert node.updates() == []
    assert "slurm: node04 left alone: drained by someone else: maintenance: replace PSU" in \
        proc.stdout
    node.write_config(gpu_count=1)
    node.run("--drain")
    assert node.updates() == []


def test_healthy_again_it_resumes_only_its_own_drain(node: Node) -> None:
    _drained(node, "scontrol_show_node.txt", "node04",
             "gpufleet: conformance/reachability: port 29500 closed")
    node.run("--drain")
    assert node.updates() == []
    _drained(node, "scontrol_show_node.txt", "node04",
             "gpufleet: healthcheck/gpus: 1 GPU(s) (NVIDIA H200), expected 2")
    proc = node.run("--drain")
    assert node.updates() == [["update", "nodename=node04", "state=resume"]]
    assert proc.returncode == 0


def test_a_failing_check_never_lifts_a_conformance_drain(node: Node) -> None:
    """The defect: a transient nvidia-smi error replaced conformance's reason with the health
    check's, and the next healthy run resumed the node. Now the conformance finding stays,
    the health check's is added beside it, and clearing it leaves the node drained."""
    conformance = ("gf allreduce/each_node_alone: busbw 12 GB/s, gate 330 "
                   "{gf1 c:allreduce/each_node_alone@1764590000}")
    _drained(node, "scontrol_show_node.txt", "node04", conformance)
    node.write_config(gpu_count=2)
    node.run("--drain")
    [update] = node.updates()
    assert update[3].startswith(f"reason={conformance.split(' {', maxsplit=1)[0]} (+1 more) {{gf1 "
                                "c:allreduce/each_node_alone@1764590000 h:gpus@")
    _drained(node, "scontrol_show_node.txt", "node04", update[3].removeprefix("reason="))
    node.write_config(gpu_count=1)
    node.run("--drain")
    assert node.updates()[-1] == ["update", "nodename=node04", "state=drain",
                                  f"reason={conformance}"]


def test_a_tools_output_in_the_reason_cannot_end_it_early(node: Node) -> None:
    """A drain reason is read back from scontrol by regex. nvidia-smi's error text, shown as
    the reason's message, must not hold what scontrol prints after a reason (`` [user@time]``,
    `` Comment=``): the reason read back would lose its findings, and the next healthy run
    resume the node despite conformance's finding beside the health check's."""
    _script(node.bin, "nvidia-smi", "echo 'Unable to determine the device handle for GPU "
                                    "0000:3B:00.0: Unknown Error [root@gpu] Comment=none'; "
                                    "exit 255\n")
    node.run("--drain")
    [update] = node.updates()
    own = update[3].removeprefix("reason=")
    assert own.startswith("gf hc/gpus: nvidia-smi failed: Unable to determine the device ")
    found = findings.parse(own)
    assert found is not None and [f.id for f in found] == ["gpus"]
    both = findings.render([*found, Finding("conformance", "allreduce/each_node_alone", 1)],
                           findings.message_of(own))
    assert program.render_reason([("h", "gpus", 1)], "x [a@b] Extra=1 {y}") == findings.render(
        [Finding("healthcheck", "gpus", 1)], "x [a@b] Extra=1 {y}")
    _drained(node, "scontrol_show_node.txt", "node04", both)
    shown = node.show.read_text()
    assert program.parse_slurm_node(shown)[1] == both
    assert [n.reason for n in client.parse_show_node(shown)] == [both]
    _script(node.bin, "nvidia-smi", f"cat {node.smi}\n")
    node.run("--drain")
    assert node.updates()[-1] == ["update", "nodename=node04", "state=drain", "reason=gf "
                                  "allreduce/each_node_alone: open since 1970-01-01T00:00Z "
                                  "{gf1 c:allreduce/each_node_alone@1}"]


def test_scontrol_failing_is_reported_and_fails_the_run(node: Node) -> None:
    captured = SLURM / "scontrol_no_controller.txt"
    _script(node.bin, "scontrol", f"cat {captured} >&2; exit 1\n")
    proc = node.run("--drain")
    assert proc.returncode == 1
    assert ("slurm: cannot read node node04: slurm_load_node error: Unable to contact slurm "
            "controller (connect failure)") in proc.stdout


@pytest.mark.parametrize(("text", "error"), [
    ('{"gpu_count": 8,\n "budget_s": }', r"healthcheck\.json line 2: the health check "
                                         "configuration is not valid JSON"),
    ('{"gpus": 8}', r"healthcheck\.json: unknown key 'gpus'"),
    ('{"gpu_count": "8"}', r"healthcheck\.json: gpu_count has a wrong type or value: '8'"),
    ('{"budget_s": 3}', r"healthcheck\.json: budget_s has a wrong type or value: 3"),
    ('[8]', r"healthcheck\.json: the health check configuration must be a JSON object"),
])
def test_a_bad_configuration_is_one_line_and_exit_2(node: Node, text: str, error: str) -> None:
    node.config.write_text(text)
    proc = node.run("--drain")
    assert proc.returncode == 2
    assert proc.stdout == "" and node.updates() == []
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: ") and re.search(error, proc.stderr)


# ---- the watch check: gpufleet-watch's report -------------------------------------------------

SYMBOL = "mlx5_0/1 symbol_error +14 in 1h0m (14.0/h, limit 10/h over 1h)"


def _finding(ident: str, status: str, message: str, **extra: object) -> dict[str, object]:
    return {"id": ident, "class": "fabric", "status": status, "since": 1764990000,
            "message": message, "silenced_until": None, "silence_reason": None, **extra}


def _report(*findings: dict[str, object], notes: list[str] | None = None) -> str:
    return json.dumps({"version": 1, "time": 1765000000.0, "findings": list(findings),
                       "notes": notes or [], "series": 212})


class Watch:
    """A stand-in gpufleet-watch: prints ``answer`` (bytes), exits ``rc``, records its argv."""

    def __init__(self, node: Node) -> None:
        self.path = node.tmp / "gpufleet-watch"
        self.answer = node.tmp / "watch-answer"
        self.calls = node.tmp / "watch-argv"
        self.set(_report())
        _script(node.tmp, "gpufleet-watch",
                f'echo "$@" >> {self.calls}\ncat {self.answer}\nexit $(cat {self.answer}.rc)\n')
        node.write_config(gpu_count=1, watch_program=str(self.path),
                          watch_config="/etc/gpufleet/watch.json")

    def set(self, answer: str | bytes, rc: int = 0) -> None:
        self.answer.write_bytes(answer.encode() if isinstance(answer, str) else answer)
        Path(f"{self.answer}.rc").write_text(str(rc))

    def argv(self) -> list[str]:
        return self.calls.read_text().splitlines()


@pytest.fixture
def watch(node: Node) -> Watch:
    return Watch(node)


def test_an_open_finding_of_the_watch_drains_with_its_message(node: Node, watch: Watch) -> None:
    watch.set(_report(_finding("rdma/mlx5_0/1/symbol_error", "open", SYMBOL),
                      _finding("pcie/0000:3b:00.0/width", "pending", "x8 of x16")), rc=1)
    proc = node.run("--drain", "--now", "1765000300")
    assert proc.returncode == 1
    assert _lines(proc)["watch"] == f"FAIL watch: {SYMBOL}"
    assert watch.argv() == ["--config /etc/gpufleet/watch.json --json --now 1765000300.000"]
    [update] = node.updates()
    assert re.fullmatch(rf"reason=gf hc/watch: {re.escape(SYMBOL)} \{{gf1 h:watch@\d+\}}",
                        update[3]), update[3]
    _drained(node, "scontrol_show_node.txt", "node04", update[3].removeprefix("reason="))
    watch.set(_report(_finding("pcie/0000:3b:00.0/width", "pending", "x8 of x16")))
    proc = node.run("--drain")
    assert _lines(proc)["watch"] == "PASS watch: 212 series, 1 pending"
    assert node.updates()[-1] == ["update", "nodename=node04", "state=resume"]
    assert watch.argv()[-1] == "--config /etc/gpufleet/watch.json --json"


def test_more_open_findings_are_counted_within_the_message_limit(node: Node,
                                                                 watch: Watch) -> None:
    long = "mlx5_0/1 " + "port_rcv_errors " * 9 + "+9999 in 1h0m"
    watch.set(_report(*(_finding(f"rdma/mlx5_{i}/1/port_rcv_errors", "open", long)
                        for i in range(3)), _finding("x", "silenced", "quiet")), rc=1)
    line = _lines(node.run())["watch"]
    message = line.removeprefix("FAIL watch: ")
    assert message.endswith(" (+2 more)") and len(message) <= program.MESSAGE_LIMIT, message
    assert message.startswith(long[:100])


def test_silenced_findings_pass_and_are_named_with_their_end(node: Node, watch: Watch) -> None:
    until = 1765080000  # 2025-12-07T04:00Z
    watch.set(_report(*(_finding(f"nvlink/gpu{i}/link{i}/replay", "silenced", "replays",
                                 silenced_until=until + i * 60, silence_reason="RMA 4711")
                        for i in range(5)), notes=["nvidia-smi nvlink -e: timed out after 4s"]))
    proc = node.run()
    assert proc.returncode == 0
    assert _lines(proc)["watch"] == (
        "PASS watch: 212 series, 0 pending; silenced: nvlink/gpu0/link0/replay until "
        "2025-12-07T04:00Z, nvlink/gpu1/link1/replay until 2025-12-07T04:01Z, "
        "nvlink/gpu2/link2/replay until 2025-12-07T04:02Z (+2 more); 1 note(s): "
        "nvidia-smi nvlink -e: timed out after 4s")


_OVERSIZED = '{"version": 1, "findings": [], "pad": "' + "x" * (1 << 20) + '"}'
GARBAGE: dict[str, tuple[str | bytes, int, str]] = {
    "traceback": ("Traceback (most recent call last):\n  ...\nKeyError: 'x'\n", 1,
                  "answered no usable report: not a JSON report: Traceback (most recent call "
                  "last): ... KeyError: 'x'"),
    "nothing": ("", 0, "gpufleet-watch exited 0 without a report: no output"),
    "nested": ("[" * 100000 + "]" * 100000, 0, "answered no usable report: not a JSON"),
    "version": ('{"version": 2, "findings": []}', 0,
                "answered no usable report: not a version 1 report"),
    "findings": ('{"version": 1, "findings": {"a": 1}}', 0,
                 "answered no usable report: a report without a findings list"),
    "status": ('{"version": 1, "findings": [{"id": "a", "status": "burning", "message": "m"}]}',
               1, "answered no usable report: a finding without an id, a message or a known "
                  "status"),
    "null": ('{"version": 1, "findings": [null]}', 0, "a finding without an id"),
    "binary": (b"\xff\xfe{garbage\x00", 0, "answered no usable report: not a JSON report"),
    "oversized": (_OVERSIZED, 0, f"answered no usable report: a report of {len(_OVERSIZED)} "
                                 f"characters, more than {1 << 20}"),
    "usage": ("", 2, "gpufleet-watch: bad configuration: no output"),
    "killed": ("", 9, "gpufleet-watch exited 9 without a report: no output"),
}


@pytest.mark.parametrize("case", sorted(GARBAGE))
def test_a_garbage_answer_is_a_failure_that_says_so(node: Node, watch: Watch,
                                                    case: str) -> None:
    answer, rc, shown = GARBAGE[case]
    watch.set(answer, rc)
    proc = node.run("--drain")
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
    line = _lines(proc)["watch"]
    assert line.startswith("FAIL watch: ") and shown in line, line
    assert "\n" not in line and len(line) < 300, line
    assert node.updates()[0][3].startswith("reason=gf hc/watch: ")


def test_the_watch_s_error_line_is_shown(node: Node, watch: Watch) -> None:
    _script(node.tmp, "gpufleet-watch", "echo 'error: /etc/gpufleet/watch.json: unknown key "
                                        "\"rule\"' >&2; exit 2\n")
    assert _lines(node.run())["watch"] == ("FAIL watch: gpufleet-watch: bad configuration: "
                                           "error: /etc/gpufleet/watch.json: unknown key 'rule'")


def test_a_missing_unrunnable_or_hung_watch_fails_within_the_budget(node: Node,
                                                                    watch: Watch) -> None:
    watch.path.unlink()
    assert _lines(node.run())["watch"] == f"FAIL watch: {watch.path} not found"
    watch.path.write_text("#!/bin/sh\n")
    assert _lines(node.run())["watch"] == ("FAIL watch: gpufleet-watch could not be started: "
                                           "Permission denied")
    _script(node.tmp, "gpufleet-watch", "exec sleep 60\n")
    node.write_config(gpu_count=1, budget_s=5, watch_program=str(watch.path))
    started = time.monotonic()
    proc = node.run("--drain")
    assert time.monotonic() - started < 5
    assert re.fullmatch(r"FAIL watch: gpufleet-watch did not answer within [12]\.\ds",
                        _lines(proc)["watch"]), proc.stdout
    assert node.updates()[0][3].startswith("reason=gf hc/watch: gpufleet-watch did not answer")


@pytest.mark.parametrize("values", [{"watch_program": "gpufleet-watch"},
                                    {"watch_config": 7}, {"watch_program": True}])
def test_the_watch_keys_are_absolute_paths_or_null(node: Node, values: dict[str, object]
                                                   ) -> None:
    node.write_config(**values)
    proc = node.run()
    assert proc.returncode == 2
    assert re.fullmatch(r"error: \S+healthcheck\.json: watch_\w+ has a wrong type or value: "
                        r".*\n", proc.stderr), proc.stderr


# ---- the role --------------------------------------------------------------------------------

def _host(tmp_path: Path, extra: str = "") -> tuple[RoleVars, PlanContext]:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    gpu01:\n      ansible_host: 10.0.0.11\n"
                    "      slurm_healthcheck: true\n" + extra)
    inv = load_inventory(path)
    host = inv.hosts["gpu01"]
    return RoleVars(host, slurm_healthcheck.ROLE.defaults), PlanContext(inv, host)


def _missing(v: RoleVars) -> Facts:
    files = slurm_healthcheck.ROLE.request(v).files
    return Facts("gpu01", {f"file:{p}": FileState(p, False) for p in files})


def test_role_installs_the_program_and_its_expectations(tmp_path: Path) -> None:
    v, ctx = _host(tmp_path, "      gpu_count: 8\n      nccl_env: {NCCL_DEBUG: WARN}\n")
    changes = slurm_healthcheck.ROLE.plan(_missing(v), v, ctx)
    assert [(c.item, c.action) for c in changes] == [
        ("slurm_healthcheck/file /usr/local/sbin/gpufleet-healthcheck", "create"),
        ("slurm_healthcheck/file /etc/gpufleet/healthcheck.json", "create"),
        ("slurm_healthcheck/file /usr/local/sbin/gpufleet-watch", "create"),
        ("slurm_healthcheck/file /etc/gpufleet/watch.json", "create")]
    program_text = slurm_healthcheck.ROLE.program(v)
    assert program_text.startswith("#!/usr/bin/python3\n# Managed by gpufleet (role "
                                   "slurm_healthcheck)")
    assert program_text.splitlines()[2:] == PROGRAM.read_text().splitlines()[1:]
    config = json.loads(slurm_healthcheck.ROLE.config(v))
    assert config["gpu_count"] == 8 and config["port_range"] == "49152 65535"
    assert config["critical_xids"] == []
    written = tmp_path / "healthcheck.json"
    written.write_text(slurm_healthcheck.ROLE.config(v))
    assert program.load_config(str(written))["gpu_count"] == 8


def test_role_plan_is_empty_when_converged(tmp_path: Path) -> None:
    v, ctx = _host(tmp_path)
    role = slurm_healthcheck.ROLE
    files = {v.string("slurm_healthcheck_path"): (role.program(v), "755"),
             v.string("slurm_healthcheck_config"): (role.config(v), "644"),
             v.string("node_watch_path"): (role.watch_program(v), "755"),
             v.string("node_watch_config"): (role.watch_config(v), "644")}
    facts = Facts("gpu01", {f"file:{path}": FileState(path, True, text.encode(), mode,
                                                      "root:root")
                            for path, (text, mode) in files.items()})
    assert slurm_healthcheck.ROLE.plan(facts, v, ctx) == []
    assert json.loads(slurm_healthcheck.ROLE.config(v))["port_range"] is None


def test_role_is_inactive_unless_asked(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    gpu01: {}\n")
    host = load_inventory(path).hosts["gpu01"]
    assert not slurm_healthcheck.ROLE.active(RoleVars(host, slurm_healthcheck.ROLE.defaults))


def test_role_installs_the_prolog_and_epilog_when_asked(tmp_path: Path) -> None:
    v, ctx = _host(tmp_path, "      slurm_prolog: true\n      slurm_epilog: yes\n"
                             "      slurm_fabric_ports: [mlx5_0/1, mlx5_3/1]\n"
                             "      slurm_job_memlock: 65536\n")
    changes = slurm_healthcheck.ROLE.plan(_missing(v), v, ctx)
    assert [(c.item, c.action) for c in changes][2:4] == [
        ("slurm_healthcheck/file /usr/local/sbin/gpufleet-prolog", "create"),
        ("slurm_healthcheck/file /usr/local/sbin/gpufleet-epilog", "create")]
    assert slurm_healthcheck.ROLE.wrapper(v, "prolog") == (
        "#!/bin/sh\n# Managed by gpufleet (role slurm_healthcheck); local edits are reported "
        "as drift and replaced.\n# Slurm's Prolog=: gpufleet-healthcheck's prolog checks "
        "(docs/slurm.md)\nexec /usr/local/sbin/gpufleet-healthcheck --config "
        '/etc/gpufleet/healthcheck.json --context prolog "$@"\n')
    config = json.loads(slurm_healthcheck.ROLE.config(v))
    assert {k: config[k] for k in ("prolog_budget_s", "epilog_budget_s", "epilog_kill_grace_s",
                                   "epilog_max_used_mib", "job_memlock_min_kib",
                                   "fabric_ports", "state_dir")} == {
        "prolog_budget_s": 5, "epilog_budget_s": 30, "epilog_kill_grace_s": 5,
        "epilog_max_used_mib": 1024, "job_memlock_min_kib": 65536,
        "fabric_ports": ["mlx5_0/1", "mlx5_3/1"], "state_dir": "/var/lib/gpufleet"}
    written = tmp_path / "healthcheck.json"
    written.write_text(slurm_healthcheck.ROLE.config(v))
    assert program.load_config(str(written))["fabric_ports"] == ["mlx5_0/1", "mlx5_3/1"]
    assert set(slurm_healthcheck.ROLE.managed_files(v)) == {
        "slurm_healthcheck_path", "slurm_healthcheck_config", "slurm_prolog_path",
        "slurm_epilog_path", "node_watch_path", "node_watch_config"}


def test_role_installs_the_gang_check_for_the_training_venv_when_asked(tmp_path: Path
                                                                       ) -> None:
    v, ctx = _host(tmp_path, "      slurm_gang_check: true\n"
                             "      pytorch_venv: /opt/train\n")
    changes = slurm_healthcheck.ROLE.plan(_missing(v), v, ctx)
    assert [(c.item, c.action) for c in changes][2:3] == [
        ("slurm_healthcheck/file /usr/local/sbin/gpufleet-gang-check", "create")]
    installed = slurm_healthcheck.ROLE.gang_check(v)
    assert installed.startswith("#!/opt/train/bin/python\n# Managed by gpufleet (role "
                                "slurm_healthcheck)")
    source = (ROOT / "gpufleet" / "node" / "gang_check.py").read_text()
    assert installed.endswith(source.split("\n", 1)[1])
    script = tmp_path / "gpufleet-gang-check"
    script.write_text(installed.replace("/opt/train/bin/python", sys.executable, 1))
    script.chmod(0o755)
    usage = subprocess.run([str(script), "--timeout", "0"], capture_output=True, text=True,
                           timeout=60, check=False)
    assert usage.returncode == 2, usage
    assert "slurm_gang_check_path" in slurm_healthcheck.ROLE.managed_files(v)
    v, ctx = _host(tmp_path, "      slurm_gang_check: true\n      pytorch_venv: venv\n")
    with pytest.raises(VarError, match="pytorch_venv must be an absolute path"):
        slurm_healthcheck.ROLE.check(v)


def test_the_prolog_and_epilog_variables_are_slurm_nodes(tmp_path: Path) -> None:
    """The slurm_node role checks slurm.conf's Prolog= and Epilog= lines with the same four
    variables: the names and defaults are shared."""
    assert {k: slurm_healthcheck.ROLE.defaults[k] for k in (
        "slurm_prolog", "slurm_prolog_path", "slurm_epilog", "slurm_epilog_path")} == {
        "slurm_prolog": False, "slurm_prolog_path": "/usr/local/sbin/gpufleet-prolog",
        "slurm_epilog": False, "slurm_epilog_path": "/usr/local/sbin/gpufleet-epilog"}
    v, ctx = _host(tmp_path)
    assert len(slurm_healthcheck.ROLE.plan(_missing(v), v, ctx)) == 4


@pytest.mark.parametrize(("extra", "error"), [
    ("      slurm_healthcheck_python: python3\n", "slurm_healthcheck_python must be an "
                                                   "absolute path"),
    ("      slurm_prolog: true\n      slurm_prolog_path: 'gpufleet-prolog'\n",
     r"slurm_prolog_path must be an absolute path of letters, digits and \. _ - / \(Slurm's "
     r"Prolog=\)"),
    ("      slurm_epilog: true\n      slurm_epilog_path: \"/usr/sbin/x y\"\n",
     "slurm_epilog_path must be an absolute"),
    ("      slurm_prolog: maybe\n", "slurm_prolog must be a boolean"),
    ("      slurm_prolog_budget_s: 2\n", "slurm_prolog_budget_s must be 3-60 seconds, got 2"),
    ("      slurm_epilog_budget_s: 301\n", "slurm_epilog_budget_s must be 3-300 seconds"),
    ("      slurm_epilog_kill_grace_s: -1\n", "slurm_epilog_kill_grace_s must be 0-60 seconds"),
    ("      slurm_epilog_max_used_mib: lots\n", "slurm_epilog_max_used_mib must be an integer"),
    ("      slurm_job_memlock: 0\n", "slurm_job_memlock must be unlimited or a positive "
                                     "number of KiB"),
    ("      slurm_fabric_ports: [mlx5_0]\n", r"slurm_fabric_ports must be a list of InfiniBand/"
                                             r"RoCE ports as device/port \(mlx5_0/1\), got"),
    ("      slurm_healthcheck_state_dir: var/lib\n", "slurm_healthcheck_state_dir must be an "
                                                      "absolute path"),
    ("      gpu_count: -1\n", "gpu_count must be 0 or more"),
    ("      slurm_healthcheck_xids: [79, x]\n", "slurm_healthcheck_xids must be a list of Xid"),
    ("      slurm_healthcheck_budget_s: 70\n", "slurm_healthcheck_budget_s must be 4-50"),
    ("      node_watch: sometimes\n", "node_watch must be a boolean"),
    ("      node_watch_path: gpufleet-watch\n", r"node_watch_path must be an absolute path of "
                                              r"letters, digits and \. _ - / \(the watch "
                                              r"program\)"),
    ("      node_watch_config: /etc/gpufleet/watch json\n", "node_watch_config must be an "
                                                         "absolute path"),
    ("      node_watch_textfile_dir: textfiles\n", "node_watch_textfile_dir must be an "
                                                  "absolute path"),
    ("      node_watch_sys_root: /sys;reboot\n", "node_watch_sys_root must be an absolute"),
    ("      node_watch_timer: hourly\n", "node_watch_timer must be a boolean"),
    ("      node_watch_rules: [symbol_error]\n", "node_watch_rules must be a mapping, got "
                                                "\\['symbol_error'\\]"),
    ("      node_watch_rules: {symbol_eror: {limit: 200}}\n",
     r"node_watch_rules: unknown key 'rules\.symbol_eror' \(known: symbol_error, "),
    ("      node_watch_rules: {symbol_error: {count: 3}}\n",
     r"node_watch_rules: unknown key 'rules\.symbol_error\.count' \(known: enabled, limit, "
     r"window_s, clear_after_s\)"),
    ("      node_watch_rules: {flaps: {count: 0}}\n",
     r"node_watch_rules: rules\.flaps\.count has a wrong type or value: 0"),
    ("      node_watch_rules: {symbol_error: {window_s: soon}}\n",
     r"node_watch_rules: rules\.symbol_error\.window_s has a wrong type or value: 'soon'"),
    ("      node_watch_rules: {aer_fatal: off}\n",
     r"node_watch_rules: rules\.aer_fatal must be an object"),
    ("      node_watch_rules: {1: {limit: 2}}\n", "node_watch_rules must be a mapping of rule "
                                                 "names to settings"),
    ("      node_watch_rules: {flaps: {1: 2}}\n", "node_watch_rules must be a mapping of rule "
                                                 "names to settings"),
])
def test_role_rejects_bad_variables(tmp_path: Path, extra: str, error: str) -> None:
    v, ctx = _host(tmp_path, extra)
    with pytest.raises(VarError, match=f"^host gpu01: variable {error}") as raised:
        slurm_healthcheck.ROLE.check(v)
        slurm_healthcheck.ROLE.plan(_missing(v), v, ctx)
    assert "\n" not in str(raised.value)
    if extra.startswith("      node_watch_rules: {"):
        assert str(raised.value).endswith(f"({tmp_path / 'hosts.yml'}:6)"), raised.value


# ---- the role: gpufleet-watch ---------------------------------------------------------------

def test_role_installs_the_watch_that_the_health_check_runs(tmp_path: Path) -> None:
    v, _ = _host(tmp_path, "      node_watch_textfile_dir: /var/lib/node_exporter\n"
                             "      node_watch_rules: {symbol_error: {limit: 200}, "
                             "flaps: {count: 4, window_s: 86400}}\n"
                             f"      node_watch_sys_root: {tmp_path / 'sys'}\n"
                             f"      slurm_healthcheck_state_dir: {tmp_path / 'state'}\n")
    role = slurm_healthcheck.ROLE
    installed = role.watch_program(v)
    assert installed.startswith("#!/usr/bin/python3\n# Managed by gpufleet (role "
                                "slurm_healthcheck)")
    assert installed.splitlines()[2:] == WATCH.read_text().splitlines()[1:]
    config = json.loads(role.config(v))
    assert (config["watch_program"], config["watch_config"]) == (
        "/usr/local/sbin/gpufleet-watch", "/etc/gpufleet/watch.json")
    written = tmp_path / "watch.json"
    written.write_text(role.watch_config(v))
    settings, rules = watcher.load_config(str(written))
    assert {k: settings[k] for k in ("state_dir", "textfile_dir", "sys_root", "budget_s")} == {
        "state_dir": str(tmp_path / "state"), "textfile_dir": "/var/lib/node_exporter",
        "sys_root": str(tmp_path / "sys"), "budget_s": 4}
    assert (rules["symbol_error"].limit, rules["flaps"].count, rules["flaps"].window_s) == (
        200, 4, 86400)
    script = tmp_path / "gpufleet-watch"
    script.write_text(installed.replace("/usr/bin/python3", sys.executable, 1))
    script.chmod(0o755)
    ran = subprocess.run([str(script), "--config", str(written), "--json"],
                         capture_output=True, text=True, timeout=60, check=False,
                         env={"PATH": "/nonexistent"})
    assert ran.returncode == 0, ran.stderr
    assert program.watch_result(ran.stdout).line() == "PASS watch: 0 series, 0 pending"


def test_the_watch_s_budget_leaves_the_health_check_time_to_drain(tmp_path: Path) -> None:
    for budget, watch_budget in ((9, 4), (20, 15), (5, 1), (4, 1)):
        v, _ = _host(tmp_path, f"      slurm_healthcheck_budget_s: {budget}\n")
        assert json.loads(slurm_healthcheck.ROLE.watch_config(v))["budget_s"] == watch_budget


def test_without_node_watch_there_is_no_watch(tmp_path: Path) -> None:
    v, ctx = _host(tmp_path, "      node_watch: false\n      node_watch_timer: true\n")
    changes = slurm_healthcheck.ROLE.plan(_missing(v), v, ctx)
    assert [c.item for c in changes] == [
        "slurm_healthcheck/file /usr/local/sbin/gpufleet-healthcheck",
        "slurm_healthcheck/file /etc/gpufleet/healthcheck.json"]
    config = json.loads(slurm_healthcheck.ROLE.config(v))
    assert config["watch_program"] is None and config["watch_config"] is None
    assert set(slurm_healthcheck.ROLE.managed_files(v)) == {"slurm_healthcheck_path",
                                                            "slurm_healthcheck_config"}
    written = tmp_path / "healthcheck.json"
    written.write_text(slurm_healthcheck.ROLE.config(v))
    assert program.load_config(str(written))["watch_program"] is None


def _timer_facts(v: RoleVars, systemd: bool, converged: bool = False) -> Facts:
    role = slurm_healthcheck.ROLE
    units = role.watch_units(v)
    installed = {**{p: c for p, c in ((v.string("slurm_healthcheck_path"), role.program(v)),
                                      (v.string("slurm_healthcheck_config"), role.config(v)),
                                      (v.string("node_watch_path"), role.watch_program(v)),
                                      (v.string("node_watch_config"), role.watch_config(v)))},
                 **{slurm_healthcheck.WATCH_UNITS[k]: units[k] for k in units}}
    modes = {v.string("slurm_healthcheck_path"): "755", v.string("node_watch_path"): "755"}
    values: dict[str, object] = {
        f"file:{p}": FileState(p, converged, c.encode() if converged else b"",
                               modes.get(p, "644") if converged else None,
                               "root:root" if converged else None)
        for p, c in installed.items()}
    values[f"link:{slurm_healthcheck.WATCH_TIMER_LINK}"] = \
        "../gpufleet-watch.timer" if converged else None
    values["systemd"] = systemd
    return Facts("gpu01", values)


def test_the_timer_runs_the_watch_every_five_minutes(tmp_path: Path) -> None:
    v, ctx = _host(tmp_path, "      node_watch_timer: yes\n"
                             "      node_watch_config: /etc/gpufleet/watch-site.json\n")
    role = slurm_healthcheck.ROLE
    request = role.request(v)
    assert set(slurm_healthcheck.WATCH_UNITS.values()) <= request.files
    assert request.links == {slurm_healthcheck.WATCH_TIMER_LINK}
    changes = role.plan(_timer_facts(v, systemd=True), v, ctx)
    assert [(c.item, c.action) for c in changes][4:] == [
        ("slurm_healthcheck/file /etc/systemd/system/gpufleet-watch.service", "create"),
        ("slurm_healthcheck/file /etc/systemd/system/gpufleet-watch.timer", "create"),
        ("slurm_healthcheck/link /etc/systemd/system/timers.target.wants/gpufleet-watch.timer",
         "link"),
        ("slurm_healthcheck/service gpufleet-watch.timer", "restart")]
    assert [s.command for s in changes[-1].steps] == [  # type: ignore[attr-defined]
        "systemctl daemon-reload", "systemctl restart gpufleet-watch.timer"]
    units = role.watch_units(v)
    assert "ExecStart=/usr/local/sbin/gpufleet-watch --config /etc/gpufleet/watch-site.json\n" \
        in units["service"]
    assert "Type=oneshot\n" in units["service"] and "SuccessExitStatus=1\n" in units["service"]
    assert "OnUnitActiveSec=5min\n" in units["timer"] and "WantedBy=timers.target\n" in \
        units["timer"]
    without_systemd = role.plan(_timer_facts(v, systemd=False), v, ctx)
    assert without_systemd[-1].item.endswith("link /etc/systemd/system/timers.target.wants/"
                                             "gpufleet-watch.timer")
    assert role.plan(_timer_facts(v, systemd=True, converged=True), v, ctx) == []
    assert {"watch service unit", "watch timer unit"} <= set(role.managed_files(v))


