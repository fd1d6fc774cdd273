"""gpudirect: on GPU nodes with RDMA devices, GPUDirect RDMA open (nvidia-peermem loaded, or
the dma-buf route: the open kernel module on a kernel of 5.12 or later with dma-buf) and not
turned off by NCCL_NET_GDR_LEVEL (nccl.conf, the inventory's nccl_env); and, where
gpudirect_nccl_log names an NCCL INFO log on the node, every channel over the network in it
carrying GDRDMA. The multi-node AllReduce's own log is judged by the allreduce suite.

Variables: gpudirect_required (true), gpudirect_nccl_log (unset), kernel_state_root (/).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.conformance.checks.gpudirect import (
    causes,
    gdr_settings,
    log_problem,
    nvlink_node,
    read_log,
    reads_gpu_memory,
    route,
    route_problem,
    setting_problem,
)
from gpufleet.conformance.session import Node, RecordProperty
from gpufleet.conformance.suites.gpudirect import GpudirectSettings


def _applies(node: Node) -> dict[str, Any]:
    """The node's ``gpudirect`` fact where the checks apply (a GPU node with RDMA devices and
    gpudirect_required); skips otherwise, fails unknown without the fact."""
    if not node.typed(GpudirectSettings).gpudirect_required:
        pytest.skip("gpudirect_required is false")
    facts = node.known
    if not facts.get("gpus") and not facts.get("pci_gpus"):
        pytest.skip("no NVIDIA GPU")
    state: dict[str, Any] | None = facts.get("gpudirect")
    if state is None:
        pytest.fail(f"unknown: the GPUDirect facts: {facts.why_absent('gpudirect')}")
    if not state["rdma"]:
        pytest.skip("no RDMA device (/sys/class/infiniband is empty)")
    return state


def test_gpudirect_route(node: Node, record_property: RecordProperty) -> None:
    state = _applies(node)
    settings = gdr_settings(node.var("nccl_env"), state)
    record_property("gpudirect_route", route(state) or "none")
    record_property("rdma_devices", state["rdma"])
    problems = [p for p in (setting_problem(settings), route_problem(state)) if p]
    if problems:
        record_property("finding_class", "configuration")
    assert not problems, f"{node.name}: GPUDirect RDMA is off: " + "; ".join(problems)


def test_gpudirect_in_nccl_log(node: Node, record_property: RecordProperty) -> None:
    path = node.typed(GpudirectSettings).gpudirect_nccl_log
    if path is None:
        pytest.skip("no NCCL log named (gpudirect_nccl_log); the allreduce suite judges its "
                    "own run's")
    state = _applies(node)
    facts = node.known
    text: str | None = facts.get(f"gpudirect_log:{path}")
    if text is None:
        pytest.fail(f"unknown: {facts.why_absent(f'gpudirect_log:{path}')}")
    log = read_log(text)
    record_property("nccl_version", log.version or "unknown")
    record_property("gdr_routes", log.routes())
    if log.used is None:
        pytest.fail(f"unknown: the NCCL log at {path} shows no channel over an RDMA network "
                    "(a single-node run, or NCCL used sockets)")
    settings = gdr_settings(node.var("nccl_env"), state)
    problem = log_problem(log, {}, node.name,
                          reads_gpu_memory(settings, log, nvlink_node(facts.get("nvlink"))))
    if problem is not None:
        record_property("finding_class", "configuration")
        why = causes(state, facts.why_absent("gpudirect"), settings, log)
        pytest.fail(f"{node.name}: {problem} ({path}) -- cause: {'; '.join(why)}")
