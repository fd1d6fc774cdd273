"""stack: driver, CUDA, NCCL and PyTorch versions are what the inventory pins; the loaded
kernel module is the installed driver; torch's NCCL is reported beside the system's; every
host of a group agrees.

Variables (the provisioning roles' own): nvidia_driver_version, cuda_version, nccl_version
(+ nccl_cuda), pytorch_version, pytorch_cuda, pytorch_venv.
"""

from __future__ import annotations

import shlex

import pytest

from gpufleet import parsers
from gpufleet.conformance.session import ConformanceSession, Node
from gpufleet.drift import check_consistency
from gpufleet.errors import ParseError
from gpufleet.facts.catalog import TORCH_PROBE
from gpufleet.role import RoleVars
from roles import cuda, nccl, pytorch


def test_driver(node: Node) -> None:
    wanted = node.var("nvidia_driver_version")
    loaded = node.facts.get("nvidia_module")  # type: ignore[union-attr]
    if loaded is None:
        if wanted is None:
            pytest.skip("no NVIDIA kernel module loaded and the inventory pins no driver")
        pytest.fail(f"no NVIDIA kernel module loaded (inventory wants {wanted}): "
                    f"{node.facts.why_absent('nvidia_module')}")  # type: ignore[union-attr]
    gpus = node.facts.get("gpus") or []  # type: ignore[union-attr]
    userspace = {str(g.get("driver_version")) for g in gpus}
    assert not userspace or userspace == {loaded}, \
        f"kernel module {loaded} but nvidia-smi reports driver {', '.join(sorted(userspace))}"
    if wanted is not None:
        assert loaded == str(wanted), f"loaded driver {loaded}, inventory wants {wanted}"


def test_cuda(node: Node) -> None:
    wanted = node.var("cuda_version")
    found = node.facts.cuda_version  # type: ignore[union-attr]
    if wanted is None:
        pytest.skip(f"the inventory pins no CUDA (found {found or 'none'})")
    assert found == str(wanted), f"CUDA toolkit {found}, inventory wants {wanted}"


def test_system_nccl(node: Node) -> None:
    if node.var("nccl_version") is None:
        pytest.skip("the inventory pins no NCCL")
    v = RoleVars(node.host, nccl.ROLE.defaults)
    wanted = nccl.ROLE.wanted(v)
    packages = node.facts.get("packages") or {}  # type: ignore[union-attr]
    for name, version in wanted.items():
        found = (packages.get(name) or {}).get("version") \
            if (packages.get(name) or {}).get("installed") else None
        assert found == version, f"{name} {found or 'not installed'}, inventory wants {version}"


def test_pytorch(node: Node, record_property: pytest.RecordProperty) -> None:
    if node.var("pytorch_version") is None:
        pytest.skip("the inventory pins no PyTorch")
    v = RoleVars(node.host, pytorch.ROLE.defaults)
    python = pytorch.ROLE.venv_python(v)
    probe = node.run(f"{shlex.quote(python)} -c {shlex.quote(TORCH_PROBE)}", timeout=300)
    try:
        info = parsers.torch_info(probe.stdout if probe.ok else probe.stderr)
    except ParseError as exc:
        pytest.fail(f"importing torch under {python} failed: {exc}")
    packages = node.facts.get("packages") or {}  # type: ignore[union-attr]
    system = (packages.get("libnccl2") or {}).get("version")
    record_property("torch", info.get("torch"))
    record_property("torch_cuda", info.get("cuda"))
    record_property("torch_nccl", info.get("nccl"))
    record_property("system_nccl", system)
    problems = pytorch.verify(info, v.string("pytorch_version"), v.opt_string("pytorch_cuda"),
                              v.opt_string("pytorch_nccl"))
    assert not problems, "; ".join(problems)


def test_versions_agree_within_each_group(conformance: ConformanceSession) -> None:
    facts = {n: node.facts for n, node in conformance.nodes.items() if node.facts}
    if len(facts) < 2:
        pytest.skip("fewer than two reachable nodes selected")
    found = check_consistency(conformance.inventory, facts)
    conformance.add_report("stack", "inconsistencies", [i.to_dict() for i in found])
    assert not found, "; ".join(
        f"group {i.group}: {i.key} differs ("
        + ", ".join(f"{value} on {' '.join(hosts)}" for value, hosts in i.values.items()) + ")"
        for i in found)


def test_cuda_link(node: Node) -> None:
    if node.var("cuda_version") is None:
        pytest.skip("the inventory pins no CUDA")
    v = RoleVars(node.host, cuda.ROLE.defaults)
    link = v.string("cuda_link")
    target = node.testinfra.file(link)
    assert target.exists, f"{link} is missing"
    major, minor = cuda.major_minor(v.string("cuda_version"), node.name, "cuda_version")
    home = v.string("cuda_home").format(major=major, minor=minor,
                                        version=v.string("cuda_version"))
    resolved = node.run(f"readlink -f {shlex.quote(link)}").stdout.strip()
    assert resolved == home, f"{link} resolves to {resolved}, expected {home}"
