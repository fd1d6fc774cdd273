"""host sizing: system memory at least a multiple of the GPUs' total memory, CPU cores per
GPU, /dev/shm large enough for NCCL and data loading, the GPUs' NUMA affinity, and their
PCIe link (generation and width) as expected.

Variables: host_memory_multiple (1.5), host_min_memory_gb (none), host_min_cpus (none),
host_min_cpus_per_gpu (4), host_min_shm_gb (1), host_gpu_numa ({GPU0: 0, ...}; default:
every GPU has an affinity when the host has several NUMA nodes), gpu_pcie_gen,
gpu_pcie_width.
"""

from __future__ import annotations

import pytest

from gpufleet.conformance.checks.host_sizing import SHM, shm_problem
from gpufleet.conformance.session import Node, RecordProperty
from gpufleet.conformance.suites.host_sizing import HostSizingSettings
from gpufleet.facts.gather import Facts

GT_PER_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def _facts(node: Node) -> Facts:
    return node.known


def test_memory(node: Node, record_property: RecordProperty) -> None:
    facts = _facts(node)
    total = (facts.get("meminfo") or {}).get("MemTotal")
    if total is None:
        pytest.fail(f"unknown: {facts.why_absent('meminfo')}")
    gpu_mib = sum(int(g.get("memory.total") or 0) for g in facts.get("gpus") or [])
    settings = node.typed(HostSizingSettings)
    multiple = settings.host_memory_multiple
    record_property("memory_gib", round(total / 2**30, 1))
    record_property("gpu_memory_gib", round(gpu_mib / 1024, 1))
    problems = []
    if total < multiple * gpu_mib * 2**20:
        problems.append(f"{total / 2**30:.0f} GiB of memory for {gpu_mib / 1024:.0f} GiB of GPU "
                        f"memory: below {multiple:g}x")
    minimum = settings.host_min_memory_gb
    if minimum is not None and total < minimum * 1e9:
        problems.append(f"{total / 1e9:.1f} GB of memory, below host_min_memory_gb {minimum}")
    assert not problems, "; ".join(problems)


def test_cpus(node: Node, record_property: RecordProperty) -> None:
    facts = _facts(node)
    cpus = facts.get("cpus")
    if cpus is None:
        pytest.fail(f"unknown: {facts.why_absent('cpus')}")
    gpus = len(facts.get("gpus") or [])
    record_property("cpus", cpus)
    problems = []
    settings = node.typed(HostSizingSettings)
    minimum = settings.host_min_cpus
    if minimum is not None and cpus < minimum:
        problems.append(f"{cpus} CPUs, below host_min_cpus {minimum}")
    per_gpu = int(settings.host_min_cpus_per_gpu)
    if gpus and cpus < per_gpu * gpus:
        problems.append(f"{cpus} CPUs for {gpus} GPUs: fewer than {per_gpu} per GPU")
    assert not problems, "; ".join(problems)


def test_shared_memory(node: Node, record_property: RecordProperty) -> None:
    facts = _facts(node)
    size = facts.get(SHM.name)
    if size is None:
        pytest.fail(f"unknown: {facts.why_absent(SHM.name)}")
    record_property("shm_gb", round(size / 1e9, 2))
    problem = shm_problem(size, node.typed(HostSizingSettings).host_min_shm_gb)
    assert problem is None, problem


def test_gpu_numa_affinity(node: Node, record_property: RecordProperty) -> None:
    facts = _facts(node)
    if not facts.get("gpus"):
        pytest.skip(f"no NVIDIA GPU: {facts.why_absent('gpus')}")
    topo = facts.get("gpu_topology")
    if topo is None:
        pytest.fail(f"unknown: nvidia-smi topo -m: {facts.why_absent('gpu_topology')}")
    affinity = {gpu: topo.get("numa_affinity", {}).get(gpu) for gpu in topo.get("gpus", [])}
    record_property("numa_affinity", affinity)
    expected = node.typed(HostSizingSettings).host_gpu_numa
    if expected:
        wrong = {g: (affinity.get(g), str(n)) for g, n in expected.items()
                 if affinity.get(g) != str(n)}
        assert not wrong, "; ".join(f"{g} on NUMA node {have}, expected {want}"
                                    for g, (have, want) in wrong.items())
        return
    nodes = {a for a in affinity.values() if a is not None}
    missing = [g for g, a in affinity.items() if a is None]
    if len(nodes) > 1 or (nodes and missing):
        assert not missing, f"no NUMA affinity for {', '.join(missing)}"


def test_gpu_pcie_link(node: Node) -> None:
    facts = _facts(node)
    links = facts.get("pci_gpus")
    if not links:
        pytest.skip("no NVIDIA GPU on the PCI bus")
    settings = node.typed(HostSizingSettings)
    gen, width = settings.gpu_pcie_gen, settings.gpu_pcie_width
    if gen is None and width is None:
        pytest.skip("the inventory sets neither gpu_pcie_gen nor gpu_pcie_width")
    problems = []
    for link in links:
        found_gen = GT_PER_GEN.get(float(link.get("link_speed") or 0))
        if gen is not None and found_gen != gen:
            problems.append(f"{link['address']}: PCIe gen {found_gen}, expected {gen}")
        if width is not None and link.get("width") != width:
            problems.append(f"{link['address']}: x{link.get('width')}, expected x{width}")
    assert not problems, "; ".join(problems)
