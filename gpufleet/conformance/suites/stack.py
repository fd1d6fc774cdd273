"""The stack suite: every role's plan is empty and the stack agrees with the node."""

from __future__ import annotations

from gpufleet.conformance.registry import Suite, always

SUITE = Suite(
    "stack", ("conformance",),
    "every role's plan is empty; driver, torch and NCCL settings agree with the node",
    order=10,
    cross_node=frozenset({"versions_agree_within_each_group"}),
    required_when=always)
