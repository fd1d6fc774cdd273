"""stack: every role's plan for the node is empty (the driver, CUDA, NCCL, PyTorch and the
rest are what the inventory pins, by the same computation provision and drift use); the
loaded kernel module is what nvidia-smi reports; torch imports and reports what its files
say; every host of a group agrees.

Variables: the roles' own (see docs/roles.md).
"""

from __future__ import annotations

import shlex

import pytest

from gpufleet import roles
from gpufleet.conformance.checks import stack as stack_checks
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.torch_probe import imported_torch
from gpufleet.drift.compare import check_consistency
from gpufleet.errors import GpufleetError
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles import training_python


@pytest.mark.parametrize("role", [r.name for r in roles.ALL])
def test_role_converged(node: Node, conformance: ConformanceSession, role: str,
                        record_property: RecordProperty) -> None:
    [unit] = roles.select(role)
    v = RoleVars(node.host, unit.defaults)
    if not unit.active(v):
        pytest.skip(f"the inventory asks the {role} role for nothing on this node")
    try:
        changes = unit.plan(node.known, v, PlanContext(conformance.inventory, node.host))
    except GpufleetError as exc:
        pytest.fail(f"unknown: {exc}")
    record_property("items", [c.item for c in changes])
    assert not changes, "; ".join(f"{c.resource}: {c.before} (wants {c.after})"
                                  for c in changes)


def test_driver_userspace_matches_the_module(node: Node) -> None:
    loaded = node.known.get("nvidia_module")
    if loaded is None:
        pytest.skip(f"no NVIDIA kernel module loaded: "
                    f"{node.known.why_absent('nvidia_module')}")
    gpus = node.known.get("gpus") or []
    userspace = {str(g.get("driver_version")) for g in gpus}
    assert not userspace or userspace == {loaded}, \
        f"kernel module {loaded} but nvidia-smi reports driver {', '.join(sorted(userspace))}"


def test_torch_imports(node: Node, conformance: ConformanceSession,
                       record_property: RecordProperty) -> None:
    python = training_python(node.host)
    recorded = node.facts.torch(python) if node.facts else None
    if recorded is None:
        pytest.skip(f"no torch under {python}")
    info = imported_torch(node, conformance)
    if isinstance(info, str):
        pytest.fail(info)
    for key in ("torch", "cuda", "nccl"):
        record_property(f"torch_{key}" if key != "torch" else "torch", info.get(key))
    assert info.get("torch") == recorded.get("torch"), \
        f"torch imports as {info.get('torch')}, its files say {recorded.get('torch')}"


def test_nccl_environment(node: Node, record_property: RecordProperty) -> None:
    """Every interface, HCA and GID that nccl.conf and the environment file name exists
    (and is up) on this node."""
    paths = [roles.provided(node.host, "nccl_conf", "/etc/nccl.conf"),
             roles.provided(node.host, "nccl_env_file", "/etc/default/gpufleet-nccl")]
    texts = [node.run(f"cat {shlex.quote(p)} 2>/dev/null || true", timeout=30).stdout
             for p in paths]
    found = stack_checks.settings(*texts)
    if not found:
        pytest.skip(f"no NCCL settings in {' or '.join(paths)}")
    record_property("settings", found)
    facts = node.facts
    interfaces = (facts.get("interfaces") if facts else None) or []
    rdma = facts.get("rdma") if facts else None
    problems = stack_checks.lint(found, interfaces, rdma)
    for path in stack_checks.gid_paths(found, rdma or []):
        gid = node.run(f"cat {shlex.quote(path)} 2>/dev/null", timeout=30).stdout.strip()
        if not gid or set(gid) <= {"0", ":"}:
            problems.append(f"NCCL_IB_GID_INDEX={found['NCCL_IB_GID_INDEX']}: {path} is "
                            f"{'empty' if gid else 'missing'}")
    assert not problems, "; ".join(problems)


def test_versions_agree_within_each_group(conformance: ConformanceSession) -> None:
    facts = {n: node.facts for n, node in conformance.nodes.items() if node.facts}
    conformance.add_report("stack", "versions", {
        n: roles.comparable(f, conformance.nodes[n].host) for n, f in facts.items()})
    if len(facts) < 2:
        pytest.skip("fewer than two reachable nodes selected")
    found = check_consistency(conformance.inventory, facts)
    conformance.add_report("stack", "inconsistencies", [i.to_dict() for i in found])
    assert not found, "; ".join(
        f"group {i.group}: {i.key} differs ("
        + ", ".join(f"{value} on {' '.join(hosts)}" for value, hosts in i.values.items()) + ")"
        for i in found)
