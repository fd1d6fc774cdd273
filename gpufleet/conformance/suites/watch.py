"""The watch suite: the standing watch on each node has no open finding."""

from __future__ import annotations

from gpufleet.conformance.registry import Suite

SUITE = Suite(
    "watch", ("conformance",),
    "the standing watch's report: no open finding on the node (silenced ones shown)",
    order=65)
