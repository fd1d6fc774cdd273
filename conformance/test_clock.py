"""clock: the node's clock synchronised by chrony or systemd-timesyncd (or another daemon
that sets the kernel's synchronised flag), and its offset from its source within
time_max_offset_ms.

Variables: time_max_offset_ms (100), time_check_offset (true; false: synchronisation
alone).
"""

from __future__ import annotations

from gpufleet.conformance.checks.clock import TIMESYNC, clock_problem
from gpufleet.conformance.session import Node, RecordProperty
from gpufleet.conformance.suites.clock import ClockSettings


def test_clock_synchronised(node: Node, record_property: RecordProperty) -> None:
    facts = node.known
    value, timesyncd = facts.get("time_sync"), facts.get(TIMESYNC.name)
    if value is not None:
        record_property("source", value["source"])
        record_property("synchronised", value["synchronised"])
        offset = value["offset_s"] if timesyncd is None else timesyncd["offset_s"]
        if offset is not None:
            record_property("offset_ms", round(offset * 1000, 3))
    settings = node.typed(ClockSettings)
    problem = clock_problem(value, facts.why_absent("time_sync"), timesyncd,
                            settings.time_max_offset_ms if settings.time_check_offset else None)
    assert problem is None, problem
