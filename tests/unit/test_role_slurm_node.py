"""The slurm_node role: the jobs' limits (limits.d and slurmd's systemd drop-in), gres.conf
and cgroup.conf when asked, slurmd restarted when it runs with other limits, and slurm.conf
read (with its includes) and reported, never written. slurm.conf is parsed as Slurm reads it,
on real files (tests/fixtures/slurm/README.md) and the lab's generated one."""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import ParseError, VarError
from gpufleet.facts.catalog import json_safe
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import Facts
from gpufleet.facts.parsers.nvidia_smi import nvidia_smi_query
from gpufleet.facts.slurmd import (
    SLURMD,
    SlurmConf,
    Slurmd,
    conf_fact,
    conf_lines,
    parse_conf,
    read_files,
    slurmd_state,
)
from gpufleet.inventory.load import load_inventory
from gpufleet.lab.model import LabConfig, Node
from gpufleet.lab.slurm import LabSlurm, SlurmSettings
from gpufleet.provision.engine import BadVariables, validate
from gpufleet.provision.plan import MANUAL, Change, Fail, Put, Run
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles import ALL, slurm_node
from gpufleet.roles.slurm_node import DROPIN, LIMITS_FILE, ROLE, conf_findings, index_range
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"
GPUS = nvidia_smi_query((FIXTURES / "h200x2" / "query_gpu_csv.txt").read_text())
CONF = "/etc/slurm/slurm.conf"
# everything a training node needs of slurm.conf, the gpufleet prolog and epilog included
GOOD_CONF = textwrap.dedent("""\
    ProctrackType=proctrack/cgroup
    TaskPlugin=task/affinity,task/cgroup
    PropagateResourceLimitsExcept=MEMLOCK
    PrologFlags=Alloc,Contain
    SchedulerParameters=bf_continue,nohold_on_prolog_fail
    Prolog=/usr/local/sbin/gpufleet-prolog
    Epilog=/usr/local/sbin/gpufleet-epilog
    """)
Row = tuple[str, str, str | None, str | None]


def host_vars(tmp_path: Path, text: str = "") -> tuple[RoleVars, PlanContext]:
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    gpu01:\n      ansible_host: 10.0.0.11\n      slurm_node: true\n"
        + textwrap.indent(textwrap.dedent(text), " " * 6))
    inv = load_inventory(tmp_path / "hosts.yml")
    host = inv.hosts["gpu01"]
    return RoleVars(host, ROLE.defaults), PlanContext(inv, host)


def node_facts(v: RoleVars, *, written: bool = False, conf: str | None = GOOD_CONF,
               slurmd: Slurmd | None = None, **values: Any) -> Facts:
    """A node's facts: the role's files absent (or as the role writes them), systemd, two
    H200s, slurmd running with the wanted limits, and ``conf`` as slurm.conf."""
    files: dict[str, Any] = {}
    for path in ROLE.request(v).files:
        content = {LIMITS_FILE: ROLE.limits_file(v), DROPIN: ROLE.dropin(v)}.get(path)
        if path.endswith("gres.conf"):
            content = ROLE.gres_conf(GPUS, v)
        elif path.endswith("cgroup.conf"):
            content = ROLE.cgroup_conf(v)
        files[f"file:{path}"] = FileState(path, True, str(content).encode(), "644",
                                          "root:root") if written else FileState(path, False)
    running = Slurmd("loaded", 4242, ("unlimited", "unlimited"), ("131072", "131072"),
                     "24.05.4")
    return Facts("gpu01", values={
        **files, "systemd": True, "gpus": GPUS, "sysctl:fs.nr_open": "1048576",
        "slurmd": running if slurmd is None else slurmd,
        "slurm_conf:/etc/slurm": parse_conf(CONF, {CONF: conf}), **values})


def rows(changes: list[Change]) -> list[Row]:
    return [(c.item, c.action, c.before, c.after) for c in changes]


def plan(v: RoleVars, ctx: PlanContext, facts: Facts) -> list[Change]:
    return ROLE.plan(facts, v, ctx)


# ---- activation and rendering ----------------------------------------------------------------

def test_the_role_is_registered_and_inactive_unless_asked(tmp_path: Path) -> None:
    assert ROLE in ALL and slurm_node.ROLE.name == "slurm_node"
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu01: {slurm_prolog: true}\n")
    host = load_inventory(tmp_path / "hosts.yml").hosts["gpu01"]
    assert not ROLE.active(RoleVars(host, ROLE.defaults))


def test_the_limits_file_sets_both_limits_for_everyone_and_root(tmp_path: Path) -> None:
    v, _ = host_vars(tmp_path)
    lines = [line for line in ROLE.limits_file(v).splitlines() if not line.startswith("#")]
    assert lines == ["*\tsoft\tmemlock\tunlimited", "*\thard\tmemlock\tunlimited",
                     "*\tsoft\tnofile\t131072", "*\thard\tnofile\t131072",
                     "root\tsoft\tmemlock\tunlimited", "root\thard\tmemlock\tunlimited",
                     "root\tsoft\tnofile\t131072", "root\thard\tnofile\t131072"]
    assert ROLE.limits_file(v).startswith("# Managed by gpufleet (role slurm_node); ")


def test_the_drop_in_sets_slurmds_limits_memlock_in_bytes(tmp_path: Path) -> None:
    v, _ = host_vars(tmp_path)
    assert ROLE.dropin(v).endswith("[Service]\nLimitMEMLOCK=infinity\nLimitNOFILE=131072\n")
    v, _ = host_vars(tmp_path, "slurm_job_memlock: 65536\nslurm_job_nofile: '1048576'\n")
    assert ROLE.dropin(v).endswith("LimitMEMLOCK=67108864\nLimitNOFILE=1048576\n")
    assert "*\thard\tmemlock\t65536\n" in ROLE.limits_file(v)


@pytest.mark.parametrize(("variables", "lines"), [
    ("", ["Name=gpu File=/dev/nvidia[0-1]"]),
    ("slurm_gres_type: h200\n", ["Name=gpu Type=h200 File=/dev/nvidia[0-1]"]),
    ("slurm_gres_type: model\n", ["Name=gpu Type=nvidia_h200 File=/dev/nvidia[0-1]"]),
    ("slurm_gres_autodetect: true\n", ["AutoDetect=nvml"]),
])
def test_gres_conf_from_the_nodes_gpus(tmp_path: Path, variables: str, lines: list[str]) -> None:
    v, _ = host_vars(tmp_path, "slurm_gres_conf_manage: true\n" + variables)
    text = ROLE.gres_conf(GPUS, v)
    assert text.startswith("# Managed by gpufleet (role slurm_node); ")
    assert [line for line in text.splitlines() if not line.startswith("#")] == lines


def test_gres_conf_gives_each_model_its_type_and_files(tmp_path: Path) -> None:
    v, _ = host_vars(tmp_path, "slurm_gres_type: model\n")
    gpus = [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}, {"index": 1, "name": "NVIDIA H200"},
            {"index": 2, "name": "NVIDIA H100 80GB HBM3"}]
    assert ROLE.gres_conf(gpus, v).splitlines()[2:] == [
        "Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia[0,2]",
        "Name=gpu Type=nvidia_h200 File=/dev/nvidia1"]
    assert [index_range(i) for i in ([3], [0, 1, 2, 3], [0, 1, 3, 5, 6])] == [
        "3", "[0-3]", "[0-1,3,5-6]"]


def test_cgroup_conf_defaults_and_the_inventorys_settings(tmp_path: Path) -> None:
    v, _ = host_vars(tmp_path)
    assert ROLE.cgroup_conf(v).splitlines()[1:] == [
        "ConstrainCores=yes", "ConstrainDevices=yes", "ConstrainRAMSpace=yes"]
    v, _ = host_vars(tmp_path, "slurm_cgroup_conf: {constrainramspace: null, ConstrainCores: "
                               "false, AllowedRAMSpace: 98.5, CgroupPlugin: cgroup/v2}\n")
    assert ROLE.cgroup_conf(v).splitlines()[1:] == [
        "AllowedRAMSpace=98.5", "CgroupPlugin=cgroup/v2", "ConstrainCores=no",
        "ConstrainDevices=yes"]


# ---- validation --------------------------------------------------------------------------------

@pytest.mark.parametrize(("variables", "message"), [
    ('slurm_job_memlock: "unlimited\\n"', "variable slurm_job_memlock must be unlimited or a "
                                          "positive number of KiB"),
    ("slurm_job_memlock: -1", "slurm_job_memlock must be unlimited or"),
    ('slurm_job_memlock: "64k"', "slurm_job_memlock must be unlimited or"),
    ("slurm_job_memlock: true", "slurm_job_memlock must be unlimited or"),
    ('slurm_job_memlock: "0"', "slurm_job_memlock must be unlimited or"),
    ("slurm_job_memlock: infinity", "slurm_job_memlock must be unlimited or"),
    ('slurm_job_nofile: "1048576; reboot"', "variable slurm_job_nofile must be an integer"),
    ("slurm_job_nofile: 100", "slurm_job_nofile must be a whole number of open files from "
                              "1024 to 2147483584, got 100"),
    ("slurm_job_nofile: 4294967296", "slurm_job_nofile must be a whole number"),
    ("slurm_job_nofile: 131072.5", "slurm_job_nofile must be a whole number"),
    ("slurm_job_nofile: unlimited", "slurm_job_nofile must be an integer"),
    ('slurm_gres_type: "-h200"', "variable slurm_gres_type must be model, or a GRES type"),
    ('slurm_gres_type: "h200\\nName=gpu File=/dev/sda"', "slurm_gres_type must be model, or"),
    ('slurm_gres_type: "h200 File=/dev/sda"', "slurm_gres_type must be model, or"),
    ('slurm_gres_type: "8"', "slurm_gres_type must be model, or"),
    ("slurm_gres_type: h200\nslurm_gres_autodetect: true",
     "slurm_gres_type must be unset with slurm_gres_autodetect"),
    ('slurm_cgroup_conf: {"ConstrainCores": "yes\\nConstrainDevices=no"}',
     "slurm_cgroup_conf ConstrainCores: a cgroup.conf key"),
    ('slurm_cgroup_conf: {"Constrain Cores": "yes"}', "slurm_cgroup_conf Constrain Cores:"),
    ('slurm_cgroup_conf: {"AllowedDevicesFile": "-/etc/x"}', "slurm_cgroup_conf "
                                                             "AllowedDevicesFile:"),
    ('slurm_cgroup_conf: {"AllowedDevicesFile": "$(reboot)"}', "slurm_cgroup_conf "),
    ("slurm_cgroup_conf: {ConstrainCores: [yes]}", "slurm_cgroup_conf ConstrainCores:"),
    ('slurm_prolog_path: "/usr/local/sbin/p; rm -rf /"', "variable slurm_prolog_path must be "
                                                        "an absolute path"),
    ('slurm_epilog_path: "-/x"', "variable slurm_epilog_path must be an absolute path"),
    ("slurm_conf_dir: etc/slurm", "variable slurm_conf_dir must be an absolute path"),
    ("slurm_prolog: sometimes", "variable slurm_prolog must be a boolean"),
    ("gpu_count: -1", "variable gpu_count must be 0 or more"),
])
def test_bad_values_are_refused_with_host_variable_and_place(
        tmp_path: Path, variables: str, message: str) -> None:
    v, _ = host_vars(tmp_path, variables + "\n")
    with pytest.raises(BadVariables) as caught:
        validate([v.host], [ROLE])
    assert str(caught.value).startswith("host gpu01: ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value).split(", got ")[0]


def test_an_error_names_the_file_and_line_that_set_the_value(tmp_path: Path) -> None:
    v, _ = host_vars(tmp_path, "slurm_job_memlock: 64M\n")
    with pytest.raises(VarError) as caught:
        ROLE.check(v)
    assert str(caught.value) == ("host gpu01: variable slurm_job_memlock must be unlimited or "
                                 "a positive number of KiB (65536 for 64 MiB), got '64M' "
                                 f"({tmp_path / 'hosts.yml'}:6)")


# ---- the plan ----------------------------------------------------------------------------------

def test_a_fresh_node_gets_every_file_and_a_restart(tmp_path: Path) -> None:
    v, ctx = host_vars(tmp_path, "slurm_gres_conf_manage: true\nslurm_cgroup_conf_manage: "
                                 "true\n")
    old = Slurmd("loaded", 4242, ("8388608", "8388608"), ("1024", "524288"), "24.05.4")
    changes = plan(v, ctx, node_facts(v, slurmd=old))
    assert rows(changes) == [
        (f"slurm_node/file {LIMITS_FILE}", "create", "absent",
         f"{len(ROLE.limits_file(v))} bytes"),
        (f"slurm_node/file {DROPIN}", "create", "absent", f"{len(ROLE.dropin(v))} bytes"),
        ("slurm_node/file /etc/slurm/gres.conf", "create", "absent",
         f"{len(ROLE.gres_conf(GPUS, v))} bytes"),
        ("slurm_node/file /etc/slurm/cgroup.conf", "create", "absent",
         f"{len(ROLE.cgroup_conf(v))} bytes"),
        ("slurm_node/service slurmd", "restart", "runs with memlock 8192 KiB, nofile 1024 "
         "(hard 524288); gres.conf, cgroup.conf changed", "memlock unlimited, nofile 131072"),
    ]
    steps = [s for c in changes for s in c.steps]
    assert [s.describe() for s in steps] == [
        f"write {LIMITS_FILE}", f"write {DROPIN}", "systemctl daemon-reload",
        "write /etc/slurm/gres.conf", "write /etc/slurm/cgroup.conf", "systemctl daemon-reload",
        "restart slurmd if it runs"]
    assert steps[2] is steps[5]  # one daemon-reload, after the drop-in is written
    assert isinstance(steps[6], Run) and steps[6].command == "systemctl try-restart " \
                                                              "slurmd.service"
    assert all(isinstance(s, Put) and s.mode == 0o644 and s.owner == "root:root"
               for s in (steps[0], steps[1], steps[3], steps[4]))


def test_a_second_plan_with_the_files_as_written_is_empty(tmp_path: Path) -> None:
    v, ctx = host_vars(tmp_path, "slurm_gres_conf_manage: true\nslurm_gres_type: model\n"
                                 "slurm_cgroup_conf_manage: true\nslurm_prolog: true\n"
                                 "slurm_epilog: true\nslurm_job_memlock: 33554432\n")
    running = Slurmd("loaded", 4242, ("34359738368", "34359738368"), ("131072", "131072"),
                     "24.05.4")
    assert plan(v, ctx, node_facts(v, written=True, slurmd=running)) == []


def test_the_drop_in_alone_reloads_systemd_without_restarting_a_slurmd_already_right(
        tmp_path: Path) -> None:
    v, ctx = host_vars(tmp_path)
    facts = node_facts(v)
    facts.values[f"file:{LIMITS_FILE}"] = FileState(LIMITS_FILE, True,
                                                    ROLE.limits_file(v).encode(), "644",
                                                    "root:root")
    [change] = plan(v, ctx, facts)
    assert change.item == f"slurm_node/file {DROPIN}"
    assert [s.describe() for s in change.steps] == [f"write {DROPIN}",
                                                    "systemctl daemon-reload"]


def test_a_stopped_slurmd_is_not_restarted(tmp_path: Path) -> None:
    v, ctx = host_vars(tmp_path, "slurm_cgroup_conf_manage: true\n")
    stopped = Slurmd("loaded", 0, None, None, "24.05.4")
    assert [c.action for c in plan(v, ctx, node_facts(v, slurmd=stopped))] == [
        "create", "create", "create"]


def test_slurmd_with_the_right_files_but_old_limits_is_restarted(tmp_path: Path) -> None:
    v, ctx = host_vars(tmp_path)
    old = Slurmd("loaded", 4242, ("65536", "65536"), ("131072", "131072"), "23.11.4")
    assert rows(plan(v, ctx, node_facts(v, written=True, slurmd=old))) == [
        ("slurm_node/service slurmd", "restart", "runs with memlock 64 KiB, nofile 131072",
         "memlock unlimited, nofile 131072")]


def test_without_systemd_no_drop_in_and_old_limits_are_left_to_an_operator(
        tmp_path: Path) -> None:
    v, ctx = host_vars(tmp_path)
    captured = slurmd_state((SLURM / "slurmd_fact_no_systemd.txt").read_text())
    changes = plan(v, ctx, node_facts(v, slurmd=captured, systemd=False))
    assert rows(changes) == [
        (f"slurm_node/file {LIMITS_FILE}", "create", "absent",
         f"{len(ROLE.limits_file(v))} bytes"),
        ("slurm_node/service slurmd", MANUAL, "runs with memlock 8192 KiB, nofile 20000",
         "memlock unlimited, nofile 131072 (no systemd unit restarts it here: start slurmd "
         "under these limits)")]
    assert changes[1].steps == [] and changes[1].manual


def test_a_slurmd_systemd_does_not_know_is_left_to_an_operator(tmp_path: Path) -> None:
    v, ctx = host_vars(tmp_path)
    by_hand = Slurmd("not-found", 4242, ("65536", "65536"), ("1024", "1024"), None)
    changes = plan(v, ctx, node_facts(v, written=True, slurmd=by_hand))
    assert [(c.item, c.action) for c in changes] == [("slurm_node/service slurmd", MANUAL)]


def test_an_unknown_slurmd_is_restarted_when_its_drop_in_changes(tmp_path: Path) -> None:
    v, ctx = host_vars(tmp_path)
    facts = node_facts(v)
    del facts.values["slurmd"]
    facts.absent["slurmd"] = "systemctl timed out after 20 s"
    assert rows(plan(v, ctx, facts))[-1] == (
        "slurm_node/service slurmd", "restart", "unknown (systemctl timed out after 20 s)",
        "memlock unlimited, nofile 131072")


def test_nofile_above_fs_nr_open_fails_instead_of_locking_logins_out(tmp_path: Path) -> None:
    v, ctx = host_vars(tmp_path, "slurm_job_nofile: 2000000\n")
    changes = plan(v, ctx, node_facts(v, written=False))
    assert rows(changes)[0] == (f"slurm_node/file {LIMITS_FILE}", "verify",
                                "fs.nr_open 1048576", "nofile 2000000")
    assert isinstance(changes[0].steps[0], Fail)
    assert "exceeds this node's fs.nr_open 1048576" in changes[0].steps[0].message
    assert DROPIN not in " ".join(c.item for c in changes)


@pytest.mark.parametrize(("extra", "gpus", "problem"), [
    ("gpu_count: 8\n", GPUS, "nvidia-smi lists 2 GPU(s), gpu_count is 8"),
    ("", [], "nvidia-smi lists no GPU"),
    ("", None, "the node's GPUs are unknown (nvidia-smi timed out after 20 s)"),
])
def test_gres_conf_is_never_written_from_a_node_short_of_gpus(
        tmp_path: Path, extra: str, gpus: Any, problem: str) -> None:
    v, ctx = host_vars(tmp_path, "slurm_gres_conf_manage: true\n" + extra)
    facts = node_facts(v, written=True, gpus=gpus)
    if gpus is None:
        del facts.values["gpus"]
        facts.absent["gpus"] = "nvidia-smi timed out after 20 s"
    [change] = plan(v, ctx, facts)
    assert (change.item, change.action, change.before) == (
        "slurm_node/file /etc/slurm/gres.conf", "verify", problem)
    assert isinstance(change.steps[0], Fail)


def test_autodetect_needs_no_gpu_facts(tmp_path: Path) -> None:
    v, ctx = host_vars(tmp_path, "slurm_gres_conf_manage: true\nslurm_gres_autodetect: yes\n")
    facts = node_facts(v, written=True)
    del facts.values["gpus"]
    assert plan(v, ctx, facts) == []


def test_the_facts_it_asks_for(tmp_path: Path) -> None:
    v, _ = host_vars(tmp_path, "slurm_conf_dir: /opt/slurm/etc/\nslurm_cgroup_conf_manage: "
                               "true\n")
    request = ROLE.request(v)
    assert request.files == {LIMITS_FILE, DROPIN, "/opt/slurm/etc/cgroup.conf"}
    assert request.sysctls == {"fs.nr_open"}
    assert {f.name for f in request.custom} == {"systemd", "slurmd",
                                                "slurm_conf:/opt/slurm/etc"}
    v, _ = host_vars(tmp_path, "slurm_conf_check: false\n")
    assert {f.name for f in ROLE.request(v).custom} == {"systemd", "slurmd"}


# ---- slurm.conf: read, never written ---------------------------------------------------------

def findings(text: str | None, variables: str = "", tmp_path: Path | None = None,
             slurmd: Slurmd | None = None, files: Mapping[str, str | None] | None = None
             ) -> list[Row]:
    assert tmp_path is not None
    v, _ = host_vars(tmp_path, variables)
    conf = parse_conf(CONF, {CONF: text, **(files or {})})
    return [(c.item.removeprefix("slurm_node/"), c.action, c.before, c.after)
            for c in conf_findings(conf, v, slurmd)]


def test_a_conf_with_everything_has_no_finding(tmp_path: Path) -> None:
    assert findings(GOOD_CONF, "slurm_prolog: true\nslurm_epilog: true\n", tmp_path) == []


def test_every_missing_setting_is_a_manual_change_never_a_file_change(tmp_path: Path) -> None:
    v, ctx = host_vars(tmp_path, "slurm_prolog: true\nslurm_epilog: true\n")
    changes = plan(v, ctx, node_facts(v, written=True, conf="ClusterName=lab\n"))
    assert all(c.manual and c.steps == [] and c.kind == "slurm.conf" for c in changes)
    assert rows(changes) == [
        ("slurm_node/slurm.conf Prolog", MANUAL, "absent",
         "Prolog=/usr/local/sbin/gpufleet-prolog"),
        ("slurm_node/slurm.conf Epilog", MANUAL, "absent",
         "Epilog=/usr/local/sbin/gpufleet-epilog"),
        ("slurm_node/slurm.conf PrologFlags", MANUAL, "absent", "PrologFlags=Alloc"),
        ("slurm_node/slurm.conf SchedulerParameters", MANUAL, "absent",
         "SchedulerParameters includes nohold_on_prolog_fail"),
        ("slurm_node/slurm.conf PropagateResourceLimits", MANUAL,
         "absent: every limit of the submitting shell is propagated, memlock too",
         "PropagateResourceLimitsExcept=MEMLOCK"),
        ("slurm_node/slurm.conf TaskPlugin", MANUAL, "absent",
         "TaskPlugin=task/cgroup,task/affinity")]


def test_an_absent_or_unread_slurm_conf_is_reported(tmp_path: Path) -> None:
    v, ctx = host_vars(tmp_path)
    assert rows(plan(v, ctx, node_facts(v, written=True, conf=None))) == [
        ("slurm_node/slurm.conf", MANUAL, "absent", "/etc/slurm/slurm.conf (configless Slurm: "
         "set slurm_conf_dir to /run/slurm/conf, or slurm_conf_check false)")]
    facts = node_facts(v, written=True)
    del facts.values["slurm_conf:/etc/slurm"]
    facts.absent["slurm_conf:/etc/slurm"] = "unparseable output: bad base64"
    assert rows(plan(v, ctx, facts)) == [
        ("slurm_node/slurm.conf", MANUAL, "unknown (unparseable output: bad base64)",
         "/etc/slurm/slurm.conf read")]
    v, ctx = host_vars(tmp_path, "slurm_conf_check: false\n")
    assert plan(v, ctx, node_facts(v, written=True, conf=None)) == []


def test_keys_any_case_comments_quotes_continuations_and_escapes(tmp_path: Path) -> None:
    text = ("# Prolog=/usr/local/sbin/gpufleet-prolog\n"
            "PROCTRACKTYPE = proctrack/cgroup   # the default anyway\n"
            'taskplugin="affinity,cgroup"\n'
            "PropagateResourceLimitsExcept=\\\n"
            "  MEMLOCK,NOFILE\n"
            "prologflags=contain\n"
            "schedulerparameters=NOHOLD_ON_PROLOG_FAIL\n"
            "prolog=/usr/local/sbin/gpufleet\\-prolog\n"
            "Epilog=/srv/epilog\\#1\n")
    assert findings(text, "slurm_prolog: true\n", tmp_path) == []
    conf = parse_conf(CONF, {CONF: text})
    assert [(s.value, s.where) for s in conf.all("Epilog")] == [
        ("/srv/epilog#1", "/etc/slurm/slurm.conf:9")]
    assert conf.last("propagateresourcelimitsexcept") is not None
    assert conf_lines("A=1 \\\\\nB=2\n") == [(1, "A=1 \\"), (2, "B=2")]


@pytest.mark.parametrize(("prolog", "actual"), [
    ("Prolog=/usr/local/sbin/*", None),
    ("Prolog=/usr/local/sbin/gpufleet-*", None),
    ("Prolog=/usr/local/*", "/usr/local/* (/etc/slurm/slurm.conf:1): does not run "
                            "/usr/local/sbin/gpufleet-prolog"),
    ("Prolog=../../usr/local/sbin/gpufleet-prolog", "../../usr/local/sbin/gpufleet-prolog "
     "(/etc/slurm/slurm.conf:1): does not run /usr/local/sbin/gpufleet-prolog"),
    ("Prolog=/etc/slurm/prolog.sh\nProlog=/usr/local/sbin/gpufleet-prolog", None),
    ("Prolog=/etc/slurm/prolog.sh,/usr/local/sbin/gpufleet-prolog",
     "/etc/slurm/prolog.sh,/usr/local/sbin/gpufleet-prolog (/etc/slurm/slurm.conf:1): does "
     "not run /usr/local/sbin/gpufleet-prolog"),
])
def test_prolog_lines_and_globs(tmp_path: Path, prolog: str, actual: str | None) -> None:
    rows_ = findings(f"{prolog}\nPrologFlags=Alloc\n", "slurm_prolog: true\n", tmp_path)
    prolog_rows = [r for r in rows_ if r[0] == "slurm.conf Prolog"]
    assert prolog_rows == ([] if actual is None else [
        ("slurm.conf Prolog", MANUAL, actual, "Prolog=/usr/local/sbin/gpufleet-prolog")])


def test_before_slurm_24_05_only_the_last_prolog_line_runs(tmp_path: Path) -> None:
    text = "Prolog=/usr/local/sbin/gpufleet-prolog\nProlog=/etc/slurm/prolog.sh\n" \
           "PrologFlags=Alloc\n"
    old = Slurmd("loaded", 1, None, None, "23.11.10")
    [row] = [r for r in findings(text, "slurm_prolog: true\n", tmp_path, old)
             if r[0] == "slurm.conf Prolog"]
    assert row[2] == ("/usr/local/sbin/gpufleet-prolog (/etc/slurm/slurm.conf:1), "
                      "/etc/slurm/prolog.sh (/etc/slurm/slurm.conf:2): slurmd before 24.05 "
                      "runs the last line only")
    new = Slurmd("loaded", 1, None, None, "24.11.1")
    assert not [r for r in findings(text, "slurm_prolog: true\n", tmp_path, new)
                if r[0] == "slurm.conf Prolog"]


@pytest.mark.parametrize(("lines", "actual"), [
    ("PropagateResourceLimits=NONE", None),
    ("PropagateResourceLimits=NOFILE,STACK", None),
    ("PropagateResourceLimitsExcept=memlock", None),
    ("PropagateResourceLimitsExcept=ALL", None),
    ("PropagateResourceLimits=ALL", "PropagateResourceLimits=ALL (/etc/slurm/slurm.conf:1): "
                                    "memlock is propagated"),
    ("PropagateResourceLimitsExcept=NOFILE", "PropagateResourceLimitsExcept=NOFILE "
     "(/etc/slurm/slurm.conf:1): memlock is propagated"),
    ("PropagateResourceLimits=NONE\nPropagateResourceLimitsExcept=MEMLOCK",
     "PropagateResourceLimits=NONE (/etc/slurm/slurm.conf:1) and "
     "PropagateResourceLimitsExcept=MEMLOCK (/etc/slurm/slurm.conf:2): Slurm takes one of "
     "them only"),
])
def test_the_memlock_of_the_submitting_shell_must_stay_out(
        tmp_path: Path, lines: str, actual: str | None) -> None:
    got = [r for r in findings(lines + "\nTaskPlugin=cgroup\n", "", tmp_path)
           if r[0] == "slurm.conf PropagateResourceLimits"]
    assert got == ([] if actual is None else [
        ("slurm.conf PropagateResourceLimits", MANUAL, actual,
         "PropagateResourceLimitsExcept=MEMLOCK")])


@pytest.mark.parametrize(("flags", "ok"), [
    ("Alloc", True), ("alloc,serial", True), ("Contain,X11", True), ("NoHold", True),
    ("RunInJob", True), ("Serial", False), ("", False)])
def test_prolog_flags_must_run_the_prolog_at_allocation(tmp_path: Path, flags: str,
                                                        ok: bool) -> None:
    text = f"Prolog=/usr/local/sbin/gpufleet-prolog\nPrologFlags={flags}\n" if flags else \
        "Prolog=/usr/local/sbin/gpufleet-prolog\n"
    got = [r for r in findings(text, "slurm_prolog: true\n", tmp_path)
           if r[0] == "slurm.conf PrologFlags"]
    assert (got == []) is ok


def test_the_settings_may_come_from_an_included_file(tmp_path: Path) -> None:
    main = "ClusterName=x\ninclude site.conf\nInclude /etc/slurm/gres-%c.conf\n" \
           "include nodes/*.conf\nProctrackType=proctrack/pgid\n"
    site = "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n" \
           "PropagateResourceLimitsExcept=MEMLOCK\ninclude missing.conf\ninclude site.conf\n"
    files: dict[str, str | None] = {"/etc/slurm/site.conf": site,
                                    "/etc/slurm/missing.conf": None}
    conf = parse_conf(CONF, {CONF: main, **files})
    assert conf.not_read == {"/etc/slurm/gres-%c.conf": "a glob or %c, which gpufleet does "
                                                        "not expand",
                             "nodes/*.conf": "a glob or %c, which gpufleet does not expand",
                             "/etc/slurm/missing.conf": "absent",
                             "/etc/slurm/site.conf": "included again (a loop)"}
    assert findings(main, "", tmp_path, files=files) == [
        ("slurm.conf ProctrackType", MANUAL, "proctrack/pgid (/etc/slurm/slurm.conf:5)",
         "ProctrackType=proctrack/cgroup")]
    [row] = findings("include other.conf\nProctrackType=proctrack/cgroup\n"
                     "PropagateResourceLimits=NONE\n", "", tmp_path,
                     files={"/etc/slurm/other.conf": None})
    assert row == ("slurm.conf TaskPlugin", MANUAL,
                   "absent (not read: /etc/slurm/other.conf: absent)",
                   "TaskPlugin=task/cgroup,task/affinity")


def test_slurms_own_example_conf(tmp_path: Path) -> None:
    text = (SLURM / "slurm.conf.example").read_text()
    assert parse_conf(CONF, {CONF: text}).all("Prolog") == []  # only commented out there
    assert findings(text, "slurm_prolog: true\n", tmp_path) == [
        ("slurm.conf Prolog", MANUAL, "absent", "Prolog=/usr/local/sbin/gpufleet-prolog"),
        ("slurm.conf PrologFlags", MANUAL, "absent", "PrologFlags=Alloc"),
        ("slurm.conf SchedulerParameters", MANUAL, "absent",
         "SchedulerParameters includes nohold_on_prolog_fail"),
        ("slurm.conf PropagateResourceLimits", MANUAL,
         "absent: every limit of the submitting shell is propagated, memlock too",
         "PropagateResourceLimitsExcept=MEMLOCK"),
        ("slurm.conf TaskPlugin", MANUAL, "task/affinity (/etc/slurm/slurm.conf:60)",
         "TaskPlugin=task/cgroup,task/affinity")]


def test_the_docker_clusters_conf(tmp_path: Path) -> None:
    text = (SLURM / "slurm-docker-cluster.conf").read_text()
    assert [r[:3] for r in findings(text, "", tmp_path)] == [
        ("slurm.conf PropagateResourceLimits", MANUAL,
         "absent: every limit of the submitting shell is propagated, memlock too"),
        ("slurm.conf TaskPlugin", MANUAL, "task/affinity (/etc/slurm/slurm.conf:58)"),
        ("slurm.conf ProctrackType", MANUAL,
         "proctrack/linuxproc (/etc/slurm/slurm.conf:35)")]


def test_slurm_gcps_conf_and_the_cloud_conf_it_includes(tmp_path: Path) -> None:
    """slurm-gcp's slurm.conf includes cloud.conf, which its conf.py generates with the
    prolog directory (the cloud.conf here has the lines conf.py writes)."""
    text = (SLURM / "slurm-gcp.conf.tpl").read_text()
    cloud = "PrivateData=cloud\nProlog=/slurm/custom_scripts/prolog.d/*\n" \
            "Epilog=/slurm/custom_scripts/epilog.d/*\nTopologyPlugin=topology/tree\n"
    files = {"/etc/slurm/cloud.conf": cloud}
    variables = "slurm_prolog: true\nslurm_prolog_path: /slurm/custom_scripts/prolog.d/" \
                "90-gpufleet\n"
    assert findings(text, variables, tmp_path, files=files) == [
        ("slurm.conf PrologFlags", MANUAL, "absent", "PrologFlags=Alloc"),
        ("slurm.conf SchedulerParameters", MANUAL, "absent",
         "SchedulerParameters includes nohold_on_prolog_fail"),
        ("slurm.conf PropagateResourceLimits", MANUAL,
         "absent: every limit of the submitting shell is propagated, memlock too",
         "PropagateResourceLimitsExcept=MEMLOCK")]
    assert findings(text, "slurm_prolog: true\n", tmp_path, files=files)[0] == (
        "slurm.conf Prolog", MANUAL, "/slurm/custom_scripts/prolog.d/* "
        "(/etc/slurm/cloud.conf:2): does not run /usr/local/sbin/gpufleet-prolog",
        "Prolog=/usr/local/sbin/gpufleet-prolog")


def test_the_labs_generated_conf(tmp_path: Path) -> None:
    lab = LabConfig(root=tmp_path / "lab")
    text = LabSlurm(lab).render_config(SlurmSettings(), [Node(lab, 1), Node(lab, 2)])
    assert [r[:3] for r in findings(text, "", tmp_path)] == [
        ("slurm.conf TaskPlugin", MANUAL, "task/none (/etc/slurm/slurm.conf:21)"),
        ("slurm.conf ProctrackType", MANUAL, "proctrack/linuxproc (/etc/slurm/slurm.conf:20)")]


# ---- the facts' snippets and parsers -----------------------------------------------------

def test_the_conf_snippet_reads_slurm_conf_and_its_includes(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "sub").mkdir(parents=True)
    (etc / "slurm.conf").write_text("include cloud.conf\nINCLUDE /nowhere/x.conf\n"
                                    "Include %c.conf\nTaskPlugin=cgroup\n")
    (etc / "cloud.conf").write_text("include sub/more.conf\ninclude cloud.conf\n")
    (etc / "sub" / "more.conf").write_text("ProctrackType=proctrack/cgroup # more\n")
    fact = conf_fact(str(etc))
    assert fact is conf_fact(str(etc))  # one Fact per directory, whoever asks
    out = subprocess.run(["sh", "-c", fact.shell], capture_output=True, text=True, check=True)
    assert [line for line in out.stdout.splitlines() if line.startswith("@")] == [
        f"@file {etc}/slurm.conf", f"@file {etc}/cloud.conf", f"@file {etc}/sub/more.conf",
        "@missing /nowhere/x.conf"]
    conf = fact.parse(out.stdout)
    assert isinstance(conf, SlurmConf) and conf.exists
    assert [(s.value, s.where) for s in conf.all("proctracktype")] == [
        ("proctrack/cgroup", f"{etc}/sub/more.conf:1")]
    assert conf.not_read == {f"{etc}/cloud.conf": "included again (a loop)",
                             "/nowhere/x.conf": "absent",
                             "%c.conf": "a glob or %c, which gpufleet does not expand"}
    empty = subprocess.run(["sh", "-c", conf_fact(str(tmp_path / "none")).shell],
                           capture_output=True, text=True, check=True).stdout
    assert read_files(empty) == {f"{tmp_path}/none/slurm.conf": None}
    assert not conf_fact(str(tmp_path / "none")).parse(empty).exists


def test_the_slurmd_snippet_on_a_node_without_systemd() -> None:
    """Captured on a host without systemd where a lab's slurmd (Debian's 22.05.8) ran."""
    state = slurmd_state((SLURM / "slurmd_fact_no_systemd.txt").read_text())
    assert state == Slurmd(None, 18737, ("8388608", "8388608"), ("20000", "20000"), "22.05.8")
    assert state.runs_older_than(24, 5) and not state.runs_older_than(22, 5)
    assert SLURMD.guard == "systemctl"


def test_the_slurmd_parser_with_systemd_and_proc_limits() -> None:
    limits = (SLURM / "proc_limits.txt").read_text().splitlines()
    picked = [line for line in limits if line.startswith(("Max locked memory ",
                                                          "Max open files "))]
    state = slurmd_state("LoadState=loaded\nMainPID=4242\npid=4242\n" + "\n".join(picked))
    assert (state.unit, state.pid, state.memlock, state.nofile, state.version) == (
        "loaded", 4242, ("8388608", "8388608"), ("20000", "20000"), None)
    assert slurmd_state("MainPID=0\nLoadState=not-found\npid=0\n") == Slurmd(
        "not-found", 0, None, None, None)


@pytest.mark.parametrize("text", ["pid=x\n", "@file /a\n!!!\n", "garbage\n", ""])
def test_the_parsers_refuse_what_they_cannot_read(text: str) -> None:
    with pytest.raises(ParseError, match=r"slurmd fact|base64|slurm\.conf fact"):
        if text.startswith("pid"):
            slurmd_state(text)
        else:
            read_files(text)


def test_the_facts_report_shows_both_facts_as_json() -> None:
    conf = parse_conf(CONF, {CONF: "ProctrackType=proctrack/cgroup\n"})
    state = slurmd_state((SLURM / "slurmd_fact_no_systemd.txt").read_text())
    doc = json_safe({"slurm_conf:/etc/slurm": conf, "slurmd": state})
    assert doc["slurm_conf:/etc/slurm"]["settings"] == {"proctracktype": [
        {"value": "proctrack/cgroup", "file": CONF, "line": 1}]}
    assert doc["slurmd"]["memlock"] == ["8388608", "8388608"]
    json.dumps(doc)
