"""Combined job steps on the lab's real Slurm (slurmctld and munged on the controller, slurmd
in two lab nodes): each task runs its own node's command, laid out by the controller, and a
task that answers for another node is refused while that node keeps its own result."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator

import pytest

from gpufleet.connect.connection import CommandResult, Unreachable, node_local
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host
from gpufleet.lab.cluster import Lab
from gpufleet.lab.slurm import LabSlurm, SlurmSettings
from gpufleet.slurm.launcher import Allocation
from tests.conftest import ROOT
from tests.lab.conftest import lab_config_for
from tests.unit.test_slurm_fanout import FORGE

NODES = 2


@pytest.fixture(scope="module")
def slurm_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Two nodes with Slurm, nothing provisioned."""
    if os.geteuid() != 0:
        pytest.skip("lab tests need root: they create network namespaces and mounts")
    inventory_dir = tmp_path_factory.mktemp("slurm-fanout-inventory") / "lab"
    shutil.copytree(ROOT / "inventory" / "lab" / "group_vars", inventory_dir / "group_vars")
    lab = Lab(lab_config_for("sf", 11, inventory_dir))
    lab.down()
    lab.up(NODES, slurm=SlurmSettings())
    yield lab
    lab.down()


@pytest.fixture
def allocation(slurm_lab: Lab) -> Iterator[Allocation]:
    inventory = load_inventory(slurm_lab.config.inventory_dir)
    allocation = Allocation.open(inventory.select("all"), LabSlurm(slurm_lab.config).client,
                                 partition="lab", time_limit_s=300)
    assert allocation.fanout is not None and allocation.job_id is not None
    yield allocation
    allocation.release()


def _together(allocation: Allocation, commands: dict[str, str]
              ) -> dict[str, CommandResult | Unreachable]:
    """Each host's command at once from its own thread, node-local: one combined step."""
    results: dict[str, CommandResult | Unreachable] = {}

    def one(host: str) -> None:
        conn = allocation.connect(Host(host, {}, frozenset({"all"})))
        with node_local():
            try:
                results[host] = conn.run(commands[host], timeout=60)
            except Unreachable as exc:
                results[host] = exc

    threads = [threading.Thread(target=one, args=(h,)) for h in commands]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_each_task_of_a_combined_step_runs_its_own_node_s_command(
        allocation: Allocation) -> None:
    before = allocation.fanout.steps if allocation.fanout else 0
    results = _together(allocation, {name: "hostname" for name in ("node01", "node02")})
    # each task's start mark named the rank and node the controller laid out, or the
    # results would have been refused
    assert {h: r.stdout for h, r in results.items()  # type: ignore[union-attr]
            } == {"node01": "node01\n", "node02": "node02\n"}
    assert allocation.fanout is not None and allocation.fanout.steps == before + 1


def test_a_task_that_answers_for_another_node_is_refused_on_real_slurm(
        allocation: Allocation) -> None:
    results = _together(allocation, {"node01": FORGE,
                                     "node02": "sleep 2; echo failing; exit 1"})
    second = results["node02"]
    assert isinstance(second, CommandResult), second
    assert (second.rc, second.stdout) == (1, "failing\n"), "node02's own task decides"
    first = results["node01"]
    assert isinstance(first, Unreachable), first
    assert str(first).startswith("node01: its task in the combined step framed another "
                                 "result ('@@gpufleet-start 1 node02')")
