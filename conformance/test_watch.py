"""watch: the standing watch on the node (``gpufleet-watch``, docs/watch.md) reports no open
finding. Its last report (the ``watch`` fact, read in the facts' one round trip) is judged
as the node's health check judges it: an open finding fails, with the first one's message,
which names the counter, its increase, window, rate and limit, and how many more are open;
a silenced finding passes and is named, with its end and reason; a pending one (seen, not
yet confirmed) passes. A report older than ``watch_max_age_s`` (by the node's clock when
its facts were gathered) fails naming its age: the watch stopped running. A report that
could not be read fails as unknown. The watch is the one judge: nothing here reads a
counter again.

SKIP where the watch is not in use: the slurm_healthcheck role off, or ``node_watch: false``.
Variables: ``watch_max_age_s`` (default 1800: six missed 5-minute runs; drift reads it
too); where the watch keeps its report is the slurm_healthcheck role's
``slurm_healthcheck_state_dir``.
"""

from __future__ import annotations

import pytest

from gpufleet.conformance.checks.watch import verdict
from gpufleet.conformance.session import Node, RecordProperty
from gpufleet.conformance.suites.watch import WatchSettings
from gpufleet.facts.watch import reading


def test_no_open_finding(node: Node, record_property: RecordProperty) -> None:
    found = reading(node.known, node.typed(WatchSettings).watch_max_age_s)
    if found is None:
        pytest.skip("the watch is not in use on this node (slurm_healthcheck off, or "
                    "node_watch false)")
    judged = verdict(found)
    for key, value in judged.properties.items():
        record_property(key, value)
    if judged.failure is not None:
        pytest.fail(judged.failure)
