"""The GPUs' standing state: the ``gpus`` fact's query (a field an older driver lacks costs
that field only), the verdict shared by the gpu_state suite and the gpu_settings role on real
captures and edits of them, the suite's declaration (in the conformance set), and the role's
plan (report, set now, keep at boot) and validation."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpufleet.conformance import registry
from gpufleet.conformance.checks.gpu_state import declared, problems, state
from gpufleet.errors import VarError
from gpufleet.facts import catalog, gpu_state
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import Facts
from gpufleet.facts.parsers.nvidia_smi import nvidia_smi_query
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.provision.plan import MANUAL, Change, Fail, Run
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles import gpu_settings
from tests.conftest import ROOT

NVIDIA = ROOT / "tests" / "fixtures" / "nvidia"
H100 = NVIDIA / "h100x1_query_gpu_state_nounits.txt"
DEFAULTS = gpu_state.Declared()


def h100(**edits: Any) -> dict[str, Any]:
    """The captured H100's row, with ``edits`` (dots written as ``__``)."""
    (gpu,) = nvidia_smi_query(H100.read_text())
    return {**gpu, **{k.replace("__", "."): v for k, v in edits.items()}}


# The fact ---------------------------------------------------------------------------------

def test_the_query_asks_for_every_field_the_judgement_reads() -> None:
    fields = catalog.GPU_QUERY.split(",")
    assert set(gpu_state.QUERY_FIELDS) <= set(fields)
    assert len(fields) == len(set(fields))
    for key in (gpu_state.ECC, gpu_state.PERSISTENCE, gpu_state.POWER_LIMIT):
        assert key in fields


def test_the_captured_query_with_units_and_without_reads_the_same() -> None:
    units = nvidia_smi_query((NVIDIA / "h100x1_query_gpu_state_units.txt").read_text())
    nounits = nvidia_smi_query(H100.read_text())
    assert units[0].keys() == nounits[0].keys()
    assert {k: units[0][k] for k in gpu_state.QUERY_FIELDS} == \
        {k: nounits[0][k] for k in gpu_state.QUERY_FIELDS}
    assert {k: units[0][k] for k in gpu_state.QUERY_FIELDS} == {
        "mig.mode.current": False, "mig.mode.pending": False, "ecc.mode.pending": True,
        "compute_mode": "Default", "power.default_limit": 700.0,
        "clocks.applications.graphics": 1980, "clocks.applications.memory": 2619,
        "clocks.default_applications.graphics": 1980,
        "clocks.default_applications.memory": 2619,
        "clocks_event_reasons.applications_clocks_setting": False}


def _fake_smi(tmp_path: Path, unknown: tuple[str, ...]) -> dict[str, str]:
    """A PATH whose nvidia-smi rejects the fields ``unknown`` as the real one does (the
    captured message, exit 2) and answers the others with one GPU of ones."""
    message = (NVIDIA / "h100x1_query_gpu_bad_field.txt").read_text().strip()
    cases = "".join(f"  *,{f},*) echo '{message.replace('no.such.field', f)}'; exit 2;;\n"
                    for f in unknown)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(textwrap.dedent("""\
        #!/bin/sh
        q=${1#--query-gpu=}
        case ",$q," in
        """) + cases + "esac\necho \"$q\"; echo \"$q\" | sed 's/[^,][^,]*/1/g'\n")
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}


def test_a_field_the_driver_does_not_know_costs_that_field_alone(tmp_path: Path) -> None:
    env = _fake_smi(tmp_path, ("mig.mode.pending", "compute_mode"))
    done = subprocess.run(["sh", "-c", catalog.GPU_QUERY_SHELL], env=env, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout
    (gpu,) = nvidia_smi_query(done.stdout)
    assert set(gpu) == set(catalog.GPU_QUERY.split(",")) - {"mig.mode.pending", "compute_mode"}
    gpu.update(index=0)
    assert [str(d) for d in gpu_state.differences([gpu], DEFAULTS, ("compute_mode",))] == [
        "GPU0: compute mode not reported (this driver's nvidia-smi lacks the field), expected "
        "Default (gpu_state_compute_mode)"]


def test_a_failing_nvidia_smi_keeps_its_message_and_status(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn'\"'\"'t "
                   "communicate with the NVIDIA driver.'\nexit 9\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-c", catalog.GPU_QUERY_SHELL], env=env, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 9 and "NVIDIA-SMI has failed" in done.stdout


# The verdict ------------------------------------------------------------------------------

def test_the_captured_gpu_as_it_comes_passes() -> None:
    assert problems([h100()], DEFAULTS) == ([], [])
    assert state([h100()])["GPU0"]["compute_mode"] == "Default"


FAULTS = {
    "MIG on": (dict(mig__mode__current=True, mig__mode__pending=True),
               "GPU0: MIG mode Enabled, expected Disabled (gpu_state_mig)"),
    "ECC off, on pending": (
        dict(ecc__mode__current=False),
        "GPU0: ECC mode Disabled (Enabled pending a GPU reset or reboot), expected Enabled "
        "(gpu_state_ecc)"),
    "persistence off": (dict(persistence_mode=False),
                        "GPU0: persistence mode Disabled, expected Enabled "
                        "(gpu_persistence_mode)"),
    "power cut": (dict(power__limit=300.0),
                  "GPU0: power limit 300 W, expected 700 W (the GPU's default) "
                  "(gpu_state_power_limit_w)"),
    "application clocks lowered": (
        dict(clocks__applications__graphics=1200),
        "GPU0: application clocks memory 2619 MHz, graphics 1200 MHz, expected memory 2619 "
        "MHz, graphics 1980 MHz (the GPU's defaults) (gpu_state_app_clocks)"),
    "SM clock locked": (
        dict(clocks_event_reasons__applications_clocks_setting=True, clocks__current__sm=405),
        "GPU0: clocks locked by nvidia-smi -lgc/-lmc (SM at 405 MHz), expected not locked "
        "(gpu_state_locked_clocks)"),
    "exclusive process": (dict(compute_mode="Exclusive_Process"),
                          "GPU0: compute mode Exclusive_Process, expected Default "
                          "(gpu_state_compute_mode)"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_is_named_with_its_value_expected_value_and_variable(fault: str) -> None:
    edits, message = FAULTS[fault]
    assert problems([h100(), h100(index=1, **edits)], DEFAULTS) == (
        [message.replace("GPU0", "GPU1")], [])


def test_declared_values_replace_the_defaults() -> None:
    want = declared(mig=None, ecc=True, persistence=True, power_limit_w=600,
                    app_clocks="2619,1980", locked_clocks=True, compute_mode="exclusive_process")
    locked = h100(clocks_event_reasons__applications_clocks_setting=True,
                  compute_mode="Exclusive_Process", mig__mode__current=True)
    assert problems([locked], want) == (
        ["GPU0: power limit 700 W, expected 600 W (gpu_state_power_limit_w)"], [])
    assert problems([h100(power__limit=600.004, compute_mode="Exclusive_Process")], want) \
        == ([], [])


def test_application_clocks_set_by_ac_are_not_reported_as_a_lock() -> None:
    held = h100(clocks_event_reasons__applications_clocks_setting=True,
                clocks__applications__graphics=1500)
    differ, _ = problems([held], DEFAULTS)
    assert len(differ) == 1 and "application clocks" in differ[0]


def test_what_a_gpu_does_not_have_is_not_judged_but_what_it_does_not_report_is_unknown() -> None:
    no_mig_no_ecc = h100(mig__mode__current=None, mig__mode__pending=None,
                         ecc__mode__current=None, power__limit=None,
                         clocks__applications__graphics=None)
    assert problems([no_mig_no_ecc], DEFAULTS) == ([], [])
    mixed = [h100(), h100(index=1, ecc__mode__current=None)]
    assert problems(mixed, DEFAULTS) == (
        [], ["GPU1: ECC mode not reported, expected Enabled (gpu_state_ecc)"])
    old = {k: v for k, v in h100().items() if k != gpu_state.POWER_DEFAULT}
    assert problems([old], DEFAULTS)[1] == [
        "GPU0: power limit 700 W, expected the default limit (not reported by this driver's "
        "nvidia-smi) (gpu_state_power_limit_w)"]
    want_mig = dataclasses.replace(DEFAULTS, mig=True)
    assert problems([no_mig_no_ecc], want_mig)[0] == [
        "GPU0: MIG mode N/A, expected Enabled (gpu_state_mig)"]


def test_the_h200s_earlier_query_reports_only_what_it_asked_for() -> None:
    """The H200 capture of the query before these fields: the old fields judged, the new
    ones unknown."""
    (gpu,) = nvidia_smi_query((NVIDIA / "h200x1_query_gpu_csv_units.txt").read_text())
    differ, unknown = problems([gpu], DEFAULTS)
    assert differ == []
    assert [u.split(" ")[1] for u in unknown] == ["MIG", "power", "clocks", "compute"]


def test_app_clocks_syntax() -> None:
    assert gpu_state.parse_app_clocks("3201, 1980") == (3201, 1980)
    for bad in ("3201", "a,b", "3201,1980,1", "0,1980", "-1,5", "3201;1980"):
        with pytest.raises(ValueError):
            gpu_state.parse_app_clocks(bad)


# The suite --------------------------------------------------------------------------------

def test_gpu_state_is_in_the_conformance_set() -> None:
    assert "gpu_state" in [s.name for s in registry.select("conformance")]
    assert "gpu_state" not in [s.name for s in registry.select("acceptance")]
    assert "gpu_state" in [s.name for s in registry.select("all")]
    defaults = registry.defaults()
    assert (defaults["gpu_state_ecc"], defaults["gpu_state_mig"],
            defaults["gpu_persistence_mode"], defaults["gpu_state_compute_mode"],
            defaults["gpu_state_power_limit_w"], defaults["gpu_state_locked_clocks"]) == \
        (True, False, True, "Default", None, False)


# The role ---------------------------------------------------------------------------------

def inventory(tmp_path: Path, text: str = "") -> Inventory:
    body = "all:\n  hosts:\n    gpu01:\n      ansible_host: 10.0.0.11\n" \
           "      nvidia_driver_version: \"580.159.04\"\n" + \
        textwrap.indent(textwrap.dedent(text), " " * 6)
    (tmp_path / "hosts.yml").write_text(body)
    return load_inventory(tmp_path / "hosts.yml")


def plan(inv: Inventory, facts: Facts) -> list[Change]:
    host = inv.hosts["gpu01"]
    v = RoleVars(host, gpu_settings.ROLE.defaults)
    gpu_settings.ROLE.check(v)
    assert gpu_settings.ROLE.active(v)
    return gpu_settings.ROLE.plan(facts, v, PlanContext(inv, host))


def node(*gpus: dict[str, Any], files: bool = False) -> Facts:
    values: dict[str, Any] = {"gpus": list(gpus), "systemd": True}
    if files:
        values.update({f"file:{p}": FileState(p, False)
                       for p in (gpu_settings.SCRIPT, gpu_settings.UNIT)})
        values[f"link:{gpu_settings.UNIT_LINK}"] = None
    return Facts("gpu01", values=values)


def test_the_role_reports_what_it_does_not_manage_and_writes_nothing(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    assert plan(inv, node(h100(), h100(index=1))) == []
    changes = plan(inv, node(h100(), h100(index=1, compute_mode="Exclusive_Process",
                                          power__limit=300.0)))
    assert [(c.item, c.action, c.before) for c in changes] == [
        ("gpu_settings/gpu power_limit", MANUAL, "GPU1 300 W"),
        ("gpu_settings/gpu compute_mode", MANUAL, "GPU1 Exclusive_Process")]
    assert changes[1].after == ("Default (gpu_state_compute_mode; add compute_mode to "
                                "gpu_state_manage for gpufleet to set it)")
    persistence_off = h100(persistence_mode=False)
    assert plan(inv, node(persistence_off)) == []  # the persistenced role's


def test_a_managed_setting_is_set_now_and_at_every_boot(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "gpu_state_manage: [compute_mode, power_limit, locked_clocks, "
                              "ecc]\n")
    changes = plan(inv, node(h100(), h100(index=1, compute_mode="Exclusive_Process",
                                          power__limit=300.0, ecc__mode__current=False),
                             files=True))
    by_item = {c.item: c for c in changes}
    script = by_item[f"gpu_settings/file {gpu_settings.SCRIPT}"]
    assert script.after is not None
    assert "file" in script.item and f"link {gpu_settings.UNIT_LINK}" in \
        " ".join(by_item)
    power = by_item["gpu_settings/gpu power_limit"]
    assert [s.command for s in power.steps if isinstance(s, Run)] == \
        ["nvidia-smi -i 1 -pl 700"]
    compute = by_item["gpu_settings/gpu compute_mode"]
    assert [s.command for s in compute.steps if isinstance(s, Run)] == \
        ["nvidia-smi -c DEFAULT"]
    ecc = by_item["gpu_settings/gpu ecc"]
    assert ecc.pending_reboot and [s.command for s in ecc.steps if isinstance(s, Run)] == \
        ["nvidia-smi -e 1"]
    content = gpu_settings.render("gpu-settings.sh.j2", header="h", commands=[
        c for s in ("compute_mode", "power_limit", "locked_clocks", "ecc")
        for c in gpu_settings.boot_commands(s, gpu_settings.declared(
            RoleVars(inv.hosts["gpu01"], gpu_settings.ROLE.defaults)))])
    assert "nvidia-smi -c DEFAULT || rc=1\n" in content
    assert "nvidia-smi -rgc || rc=1\nnvidia-smi -rmc || rc=1\n" in content
    assert "-pl" not in content  # the default limit comes back when the driver loads


def test_declared_watts_and_clocks_are_set_as_declared(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "gpu_state_manage: [power_limit, app_clocks, mig]\n"
                              "gpu_state_power_limit_w: 650\n"
                              "gpu_state_app_clocks: \"2619,1755\"\n")
    changes = plan(inv, node(h100(mig__mode__current=True), files=True))
    assert [(c.item, [s.command for s in c.steps if isinstance(s, Run)]) for c in changes
            if c.kind == "gpu"] == [
        ("gpu_settings/gpu mig", ["nvidia-smi -mig 0"]),
        ("gpu_settings/gpu power_limit", ["nvidia-smi -pl 650"]),
        ("gpu_settings/gpu app_clocks", ["nvidia-smi -ac 2619,1755"])]


def test_unreadable_gpus_fail_a_managed_role_and_are_left_to_the_suite_otherwise(
        tmp_path: Path) -> None:
    absent = Facts("gpu01", values={"systemd": True},
                   absent={"gpus": "nvidia-smi not found"})
    assert plan(inventory(tmp_path), absent) == []
    [change] = plan(inventory(tmp_path, "gpu_state_manage: [compute_mode]\n"),
                    Facts("gpu01", values={"systemd": False},
                          absent={"gpus": "nvidia-smi not found"}))
    assert isinstance(change.steps[0], Fail)


@pytest.mark.parametrize(("text", "message"), [
    ("gpu_state_compute_mode: exclusive\n", "gpu_state_compute_mode must be one of Default, "
                                            "Exclusive_Process, Prohibited, got 'exclusive'"),
    ("gpu_state_app_clocks: fast\n", "gpu_state_app_clocks must be 'memory,graphics'"),
    ("gpu_state_app_clocks: \"1980; reboot\"\n", "gpu_state_app_clocks must be"),
    ("gpu_state_power_limit_w: -5\n", "gpu_state_power_limit_w must be watts above 0"),
    ("gpu_state_power_limit_w: 300W\n", "gpu_state_power_limit_w must be a number"),
    ("gpu_state_manage: [persistence]\n", "gpu_state_manage must be a list of distinct"),
    ("gpu_state_manage: [ecc, ecc]\n", "gpu_state_manage must be a list of distinct"),
    ("gpu_state_mig: maybe\n", "gpu_state_mig must be"),
    ("gpu_settings: sometimes\n", "gpu_settings must be true, false or auto"),
])
def test_values_are_validated_before_any_host(tmp_path: Path, text: str, message: str) -> None:
    host = inventory(tmp_path, text).hosts["gpu01"]
    with pytest.raises(VarError, match=r"host gpu01: variable " + message.replace("(", r"\(")):
        gpu_settings.ROLE.check(RoleVars(host, gpu_settings.ROLE.defaults))
    suite = registry.suite("gpu_state")
    if suite.check is not None and not text.startswith(("gpu_state_manage", "gpu_settings")):
        with pytest.raises(VarError):
            suite.check(RoleVars(host, {}))
