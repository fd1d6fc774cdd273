"""GPU health verdicts from facts and the kernel log: pure functions, one list of problems
each (empty when healthy)."""

from __future__ import annotations

import re
from typing import Any

from gpufleet.facts import xids

SLOWDOWNS = ("clocks_event_reasons.hw_slowdown", "clocks_event_reasons.hw_thermal_slowdown",
             "clocks_event_reasons.hw_power_brake_slowdown",
             "clocks_event_reasons.sw_thermal_slowdown")
_NV = re.compile(r"^NV(\d+)\Z")
PCI_BUS = "the PCI bus"


def topology_problems(topo: dict[str, Any], expect_nvlink: bool | None) -> list[str]:
    """GPU pairs not joined by NVLink where it is expected (explicitly, or because some
    pairs are). ``expect_nvlink`` False skips the check."""
    gpus = topo.get("gpus", [])
    matrix = topo.get("matrix", {})
    links = {(a, b): matrix.get(a, {}).get(b) for a in gpus for b in gpus if a < b}
    any_nvlink = any(v and _NV.match(v) for v in links.values())
    if expect_nvlink is False or (expect_nvlink is None and not any_nvlink):
        return []
    return [f"{a}-{b} connected by {v or 'nothing'}, not NVLink" for (a, b), v in links.items()
            if not (v and _NV.match(v))]


def nvlink_problems(status: dict[int, list[float | None]]) -> list[str]:
    """Inactive NVLinks per GPU."""
    problems = []
    for gpu, links in sorted(status.items()):
        inactive = [i for i, speed in enumerate(links) if speed is None]
        if inactive:
            problems.append(f"GPU{gpu} NVLink(s) {', '.join(map(str, inactive))} inactive")
    return problems


def health_problems(gpus: list[dict[str, Any]], max_temp_c: float,
                    pcie_gen: int | None, pcie_width: int | None) -> list[str]:
    """ECC errors, row remapping, slowdowns, temperature and PCIe link per GPU (persistence
    mode is the gpu_state suite's)."""
    problems = []
    for gpu in gpus:
        name = f"GPU{gpu.get('index')}"
        if gpu.get("ecc.errors.uncorrected.volatile.total"):
            problems.append(f"{name}: {gpu['ecc.errors.uncorrected.volatile.total']} "
                            "uncorrectable ECC errors since boot")
        if gpu.get("remapped_rows.pending"):
            problems.append(f"{name}: row remapping pending (reset the GPU)")
        if gpu.get("remapped_rows.failure"):
            problems.append(f"{name}: row remapping failed (replace the GPU)")
        active = [key.split(".", 1)[1] for key in SLOWDOWNS if gpu.get(key)]
        if active:
            problems.append(f"{name}: clock slowdown active: {', '.join(active)}")
        temp = gpu.get("temperature.gpu")
        if isinstance(temp, (int, float)) and temp > max_temp_c:
            problems.append(f"{name}: {temp} C, above {max_temp_c:g} C")
        if pcie_gen is not None and gpu.get("pcie.link.gen.max") != pcie_gen:
            problems.append(f"{name}: PCIe gen {gpu.get('pcie.link.gen.max')}, "
                            f"expected {pcie_gen}")
        width = gpu.get("pcie.link.width.current")
        expected_width = pcie_width or gpu.get("pcie.link.width.max")
        if width is not None and expected_width is not None and width != expected_width:
            problems.append(f"{name}: PCIe x{width}, expected x{expected_width}")
    return problems


# What each action class of NVIDIA's Xid catalogue makes of the check (docs/conformance.md).
XID_VERDICTS = ("fail", "warn", "ignore")
VERDICT_OF = {"ignore": "ignore", "application": "warn", "reset": "fail", "reboot": "fail",
              "hardware": "fail"}


def xid_policy(overrides: dict[Any, Any]) -> dict[int, str]:
    """The inventory's Xid -> fail, warn or ignore, which wins over the catalogue's class;
    ValueError names a bad entry."""
    policy = {}
    for key, verdict in overrides.items():
        if not str(key).isdigit() or str(verdict) not in XID_VERDICTS:
            raise ValueError(f"gpu_xid_policy entry {key}: {verdict} (want XID: fail, warn or "
                             "ignore)")
        policy[int(key)] = str(verdict)
    return policy


def xid_verdict(events: list[dict[str, Any]], policy: dict[int, str],
                since: float | None = None) -> tuple[list[str], list[str]]:
    """(failures, warnings) among the events at or after ``since`` seconds after boot
    (all events without a time, or when ``since`` is None): each event judged by NVIDIA's
    catalogue in the context of all of them (gpufleet/facts/xids.py), then ``policy``."""
    fail, warn = [], []
    for v in xids.judge(events):
        if since is not None and v.at is not None and v.at < since:
            continue
        verdict = policy.get(v.code, VERDICT_OF[v.action])
        text = xids.describe(v) + (f": {v.message}" if v.message else "")
        if verdict == "fail":
            fail.append(text)
        elif verdict == "warn":
            warn.append(text)
    return fail, warn


def fabric_problems(gpus: list[dict[str, Any]]) -> list[str]:
    """GPUs whose NVSwitch fabric is not up (State Completed, Status Success); GPUs without
    a fabric (N/A) have none."""
    problems = []
    for index, gpu in enumerate(gpus):
        state, status = gpu.get("fabric_state"), gpu.get("fabric_status")
        if state in (None, "N/A"):
            continue
        if (state, status) != ("Completed", "Success"):
            problems.append(f"GPU{index} ({gpu.get('bus_id')}): fabric state {state}, status "
                            f"{status} (is nvidia-fabricmanager running at the driver's "
                            "version?)")
    return problems


def fabricmanager_problem(fabricmanager: str | None, driver: str | None) -> str | None:
    """A fabricmanager installed at another version than the loaded driver (it then refuses
    to start, and CUDA does not initialise on NVSwitch systems)."""
    if fabricmanager is None or driver is None or fabricmanager == driver:
        return None
    return f"nvidia-fabricmanager {fabricmanager} but the loaded driver is {driver}"


def dcgm_problems(diag: dict[str, Any]) -> list[str]:
    """Failed DCGM diagnostics, by GPU and test (warnings are not failures)."""
    if diag.get("error"):
        return [f"dcgmi diag did not run: {diag['error']}"]
    return [f"GPU {t['gpu']}: {t['name']} {t['status']}" + (f" ({t['info']})" if t["info"]
                                                          else "")
            for t in diag["tests"] if t["status"] in ("FAIL", "ERROR")]


def inventory_problems(counts: dict[str, int | None], wanted: int | None) -> list[str]:
    """Every source of the GPU count must agree: the PCI bus, ``nvidia-smi -L``, the query,
    the topology matrix, and ``gpu_count`` when set. A source that is None (not read) is
    left out, as is a PCI bus that shows no NVIDIA device where nvidia-smi sees GPUs (a
    container or VM without the PCI tree)."""
    seen = {name: n for name, n in counts.items() if n is not None}
    if seen.get(PCI_BUS) == 0 and any(n for k, n in seen.items() if k != PCI_BUS):
        del seen[PCI_BUS]
    if wanted is not None:
        seen["gpu_count"] = wanted
    if len(set(seen.values())) <= 1:
        return []
    return ["GPU counts disagree: " + ", ".join(f"{n} on {name}" for name, n in seen.items())]
