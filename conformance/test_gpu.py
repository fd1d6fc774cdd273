"""gpu: count and model as the inventory says; NVLink between every GPU pair where expected
and no inactive link; PCIe link; no uncorrectable ECC errors, no pending or failed row
remapping; no Xid in the kernel log since boot that NVIDIA's catalogue, read in context,
says needs a GPU reset, a reboot or a person (gpufleet/facts/xids.py); no thermal or power
slowdown; temperature under the limit (persistence mode is the gpu_state suite's).

NVSwitch fabric up on every GPU and fabricmanager at the driver's version; DCGM's
diagnostics pass where DCGM is installed. Every GPU's compute capability is supported by the
node's CUDA toolkit, driver and torch build (checks/gpu_generations.py); GPUs of one model per
node and per group.

Variables: gpu_count, gpu_model, gpu_nvlink (expected; default: when any pair has NVLink),
gpu_pcie_gen, gpu_pcie_width, gpu_max_temp_c (85),
gpu_critical_xids (Xids that fail whatever their class; none by default), gpu_xid_policy
(Xid -> fail, warn or ignore, over the catalogue's class),
gpu_xid_window_h (only Xids of the last N hours count; default: since boot),
gpu_dcgm_diag_level (1; 0 turns the diagnostics off), gpu_mixed_models (false: a node or
a group with GPUs of two models fails).
"""

from __future__ import annotations

import pytest

from gpufleet.conformance.checks.gpu import (
    dcgm_problems,
    fabric_problems,
    fabricmanager_problem,
    health_problems,
    inventory_problems,
    nvlink_problems,
    topology_problems,
    xid_policy,
    xid_verdict,
)
from gpufleet.conformance.checks.gpu_generations import (
    capabilities,
    mixed,
    models_of,
    node_problems,
    toolkit_version,
)
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.gpu import GpuSettings
from gpufleet.conformance.torch_probe import imported_torch
from gpufleet.drift.compare import consistency_groups
from gpufleet.errors import ParseError
from gpufleet.facts.parsers import dcgm, xid
from gpufleet.roles import training_python


def _gpus(node: Node) -> list[dict[str, object]]:
    facts = node.known
    gpus: list[dict[str, object]] | None = facts.get("gpus")
    if gpus is None:
        reason = facts.why_absent("gpus")
        if facts.timed_out("gpus"):
            pytest.fail(f"nvidia-smi hung: {reason}")
        if "not found" in reason or not facts.get("pci_gpus"):
            pytest.skip(f"no NVIDIA GPU: {reason}")
        pytest.fail(f"unknown: NVIDIA GPUs on the PCI bus but nvidia-smi failed: {reason}")
    if not gpus:
        pytest.skip("no NVIDIA GPU: nvidia-smi lists none")
    return gpus


def test_count_and_model(node: Node, record_property: RecordProperty) -> None:
    gpus = _gpus(node)
    facts = node.known
    models = sorted({str(g.get("name")) for g in gpus})
    record_property("gpus", len(gpus))
    record_property("models", models)
    listed, topo, on_bus = facts.get("gpu_list"), facts.get("gpu_topology"), \
        facts.get("pci_gpus")
    counts = {"the PCI bus": None if on_bus is None else len(on_bus),
              "nvidia-smi -L": None if listed is None else len(listed),
              "the nvidia-smi query": len(gpus),
              "the topology": None if topo is None else len(topo.get("gpus", []))}
    record_property("counts", counts)
    settings = node.typed(GpuSettings)
    count, model = settings.gpu_count, settings.gpu_model
    found = inventory_problems(counts, count)
    assert not found, "; ".join(found)
    if model is not None:
        assert models == [model], f"GPU model {', '.join(models)}, expected {model}"


def test_one_gpu_model(node: Node) -> None:
    by_model = models_of(_gpus(node))
    if len(by_model) > 1 and not node.typed(GpuSettings).gpu_mixed_models:
        pytest.fail(f"GPUs of {len(by_model)} models on one node: {mixed(by_model)} (declare "
                    "gpu_mixed_models: true where this is meant)")


def test_cuda_supports_every_gpu(node: Node, conformance: ConformanceSession,
                                 record_property: RecordProperty) -> None:
    gpus = _gpus(node)
    facts = node.known
    toolkit, driver = toolkit_version(facts), facts.get("driver_cuda")
    record_property("compute_capabilities", capabilities(gpus))
    record_property("toolkit_cuda", toolkit)
    record_property("driver_cuda", driver)
    problems = [] if driver else [f"unknown: the driver's CUDA version: "
                                  f"{facts.why_absent('driver_cuda')}"]
    python = training_python(node.host)
    torch = None
    if facts.torch(python) is None:
        record_property("torch", f"not checked: no torch under {python}")
    elif str(node.host.vars.get("pytorch_cuda", "")).lower() == "none":
        record_property("torch", "not checked: the inventory pins a CPU build (pytorch_cuda: "
                                 "none)")
    else:
        found = imported_torch(node, conformance)
        if isinstance(found, str):
            problems.append(f"unknown: {found}")
        elif not found.get("cuda"):
            problems.append(f"torch {found.get('torch')} is a CPU build: it cannot use the "
                            "node's GPUs")
        else:
            torch = found
            record_property("torch_arch_list", found.get("arch_list"))
    problems += node_problems(gpus, toolkit, driver, torch)
    assert not problems, "; ".join(problems)


def test_one_gpu_model_per_group(conformance: ConformanceSession) -> None:
    nodes = {n.name: n for n in conformance.ready()
             if n.known.get("gpus") and not n.typed(GpuSettings).gpu_mixed_models}
    if len(nodes) < 2:
        pytest.skip("fewer than two reachable nodes with GPUs selected")
    models = {name: sorted(models_of(n.known.get("gpus"))) for name, n in nodes.items()}
    found = []
    for group in consistency_groups(conformance.inventory, list(nodes)):
        by_model: dict[str, list[str]] = {}
        for name in sorted(conformance.inventory.groups[group] & nodes.keys()):
            for model in models[name]:
                by_model.setdefault(model, []).append(name)
        if len(by_model) > 1:
            found.append(f"group {group}: {mixed(by_model)}")
    assert not found, "; ".join(found) + " (one job must not mix GPU generations; declare " \
                                         "gpu_mixed_models: true where this is meant)"


def test_nvlink(node: Node, record_property: RecordProperty) -> None:
    _gpus(node)
    facts = node.known
    topo = facts.get("gpu_topology")
    if topo is None:
        pytest.fail(f"unknown: nvidia-smi topo -m: {facts.why_absent('gpu_topology')}")
    if len(topo.get("gpus", [])) < 2:
        pytest.skip("a single GPU: no GPU pairs")
    found = topology_problems(topo, node.typed(GpuSettings).gpu_nvlink)
    status = facts.get("nvlink")
    if status is not None:
        found += nvlink_problems(status)
    record_property("topology", topo.get("matrix"))
    assert not found, "; ".join(found)


def test_health(node: Node) -> None:
    gpus = _gpus(node)
    settings = node.typed(GpuSettings)
    found = health_problems(gpus, settings.gpu_max_temp_c, settings.gpu_pcie_gen,
                            settings.gpu_pcie_width)
    assert not found, "; ".join(found)


def test_no_critical_xid_since_boot(node: Node, record_property: RecordProperty) -> None:
    _gpus(node)
    log = node.run("if out=$(dmesg 2>&1); then printf '%s\\n' \"$out\"; "
                   "else journalctl -k -b --no-pager 2>&1; fi", timeout=60)
    if not log.ok:
        pytest.fail(f"unknown: neither dmesg nor journalctl could read the kernel log: "
                    f"{log.stdout.strip()[-200:]}")
    try:
        events = xid.xid_events(log.stdout)
    except ParseError as exc:
        pytest.fail(f"unknown: the kernel log could not be read: {exc}")
    try:
        settings = node.typed(GpuSettings)
        policy = xid_policy(dict.fromkeys((int(x) for x in settings.gpu_critical_xids),
                                          "fail") | (settings.gpu_xid_policy or {}))
        window = settings.gpu_xid_window_h
        uptime = node.known.get("uptime_s")
        since = None if window is None or uptime is None else uptime - window * 3600
    except (ValueError, TypeError) as exc:
        pytest.fail(f"bad Xid variables: {exc}")
    failures, warnings = xid_verdict(events, policy, since)
    record_property("xid_warnings", warnings)
    assert not failures, "; ".join(failures)


DCGM_TIMEOUTS = {1: 120, 2: 600, 3: 2400, 4: 7200}


def test_fabric_and_persistence(node: Node, record_property: RecordProperty) -> None:
    _gpus(node)
    facts = node.known
    fabric = facts.get("gpu_fabric")
    if fabric is None:
        pytest.fail(f"unknown: nvidia-smi -q: {facts.why_absent('gpu_fabric')}")
    record_property("gpus", [{"bus_id": g["bus_id"], "fabric": f"{g['fabric_state']} / "
                              f"{g['fabric_status']}", "persistence": g["persistence"]}
                             for g in fabric])
    found = fabric_problems(fabric)
    mismatch = fabricmanager_problem(facts.get("fabricmanager"), facts.get("nvidia_module"))
    assert not found and not mismatch, "; ".join([*found, *([mismatch] if mismatch else [])])


def test_dcgm_diagnostics(node: Node, record_property: RecordProperty) -> None:
    _gpus(node)
    level = node.typed(GpuSettings).gpu_dcgm_diag_level
    if level == 0:
        pytest.skip("gpu_dcgm_diag_level is 0")
    if level not in DCGM_TIMEOUTS:
        pytest.fail(f"gpu_dcgm_diag_level must be 0-4, got {level}")
    if not node.run("command -v dcgmi", timeout=30).ok:
        pytest.skip("DCGM is not installed (no dcgmi)")
    result = node.run(f"dcgmi diag -r {level} -j", timeout=DCGM_TIMEOUTS[level])
    try:
        diag = dcgm.dcgm_diag(result.stdout)
    except ParseError as exc:
        pytest.fail(f"unknown: dcgmi diag -r {level}: {exc}")
    record_property("dcgm", [{k: t[k] for k in ("gpu", "name", "status")}
                             for t in diag["tests"]])
    found = dcgm_problems(diag)
    assert not found, "; ".join(found)
