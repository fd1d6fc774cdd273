"""clock: the node's clock synchronised by chrony or systemd-timesyncd (or another daemon
that sets the kernel's synchronised flag), and its offset from its source within
time_max_offset_ms.

Variables: time_max_offset_ms (100), time_check_offset (true; false: synchronisation
alone).
"""

from __future__ import annotations

from gpufleet.conformance.checks.clock import clock_problem
from gpufleet.conformance.session import Node, RecordProperty
from gpufleet.conformance.suites.clock import ClockSettings


def test_clock_synchronised(node: Node, record_property: RecordProperty) -> None:
    facts = node.known
    value = facts.get("time_sync")
    if value is not None:
        record_property("source", value["source"])
        record_property("synchronised", value["synchronised"])
        if value["offset_s"] is not None:
            record_property("offset_ms", round(value["offset_s"] * 1000, 3))
    settings = node.typed(ClockSettings)
    problem = clock_problem(value, facts.why_absent("time_sync"),
                            settings.time_max_offset_ms if settings.time_check_offset else None)
    assert problem is None, problem
