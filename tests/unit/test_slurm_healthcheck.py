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
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles import slurm_healthcheck
from gpufleet.slurm import client, findings
from gpufleet.slurm.findings import Finding
from tests.conftest import FIXTURES, ROOT

SLURM = FIXTURES / "slurm"
PROGRAM = Path(program.__file__)
SMI = SLURM / "h200_nvidia_smi_query.txt"


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
                        r"3 passed, 4 skipped in \d+\.\d+s", ok), ok
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
    assert lines["roce_qos"].startswith("SKIP roce_qos: no RoCE QoS declared")
    assert list(lines) == ["gpus", "ecc", "xid", "driver", "nccl", "port_range", "roce_qos"]
    assert proc.stdout.splitlines()[-1].startswith("healthcheck node04: 0 failed, 3 passed, "
                                                   "4 skipped in ")


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
        ("slurm_healthcheck/file /etc/gpufleet/healthcheck.json", "create")]
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
    path, conf = v.string("slurm_healthcheck_path"), v.string("slurm_healthcheck_config")
    facts = Facts("gpu01", {
        f"file:{path}": FileState(path, True, slurm_healthcheck.ROLE.program(v).encode(),
                                  "755", "root:root"),
        f"file:{conf}": FileState(conf, True, slurm_healthcheck.ROLE.config(v).encode(),
                                  "644", "root:root")})
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
    assert [(c.item, c.action) for c in changes][2:] == [
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
        "slurm_epilog_path"}


def test_role_installs_the_gang_check_for_the_training_venv_when_asked(tmp_path: Path
                                                                       ) -> None:
    v, ctx = _host(tmp_path, "      slurm_gang_check: true\n"
                             "      pytorch_venv: /opt/train\n")
    changes = slurm_healthcheck.ROLE.plan(_missing(v), v, ctx)
    assert [(c.item, c.action) for c in changes][2:] == [
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
    assert len(slurm_healthcheck.ROLE.plan(_missing(v), v, ctx)) == 2


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
])
def test_role_rejects_bad_variables(tmp_path: Path, extra: str, error: str) -> None:
    v, ctx = _host(tmp_path, extra)
    with pytest.raises(VarError, match=f"^host gpu01: variable {error}"):
        slurm_healthcheck.ROLE.plan(_missing(v), v, ctx)

