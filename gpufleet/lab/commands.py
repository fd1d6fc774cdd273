"""Lab commands behind ``invoke lab.*``: they print and return exit codes."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpufleet.app import guarded
from gpufleet.lab.cluster import Lab
from gpufleet.lab.slurm import PARTITION, LabSlurm, SlurmSettings
from gpufleet.report import terminal


def _status_table(lab: Lab) -> Table:
    table = Table(pad_edge=False)
    for col in ("node", "address", "netns", "mounts", "sshd", "known_hosts"):
        table.add_column(col)
    for s in lab.status():
        table.add_row(s.name, s.address, "yes" if s.netns else "NO",
                      "yes" if s.mounted else "NO",
                      str(s.sshd_pid) if s.sshd_pid else "NOT RUNNING",
                      "yes" if s.in_known_hosts else "no")
    return table


def _slurm_report(lab: Lab, con: Console) -> bool:
    """Print the lab's Slurm daemons and node states; whether all of it is up."""
    slurm = LabSlurm(lab.config)
    if not slurm.enabled:
        return True
    status = slurm.status()
    states = {n.name: n for n in status.nodes}
    table = Table(pad_edge=False)
    for col in ("node", "slurmd", "state", "cpus", "gres", "reason"):
        table.add_column(col)
    for name, pid in status.slurmd.items():
        node = states.get(name)
        table.add_row(name, str(pid) if pid else "NOT RUNNING", node.state if node else "?",
                      str(node.cpus) if node else "?", node.gres if node else "?",
                      escape(node.reason or "") if node else "")
    con.print(table)
    daemons = (f"munged {status.munged or 'NOT RUNNING'}, "
               f"slurmctld {status.slurmctld or 'NOT RUNNING'}")
    con.print(f"slurm: {daemons}; partition {PARTITION}; "
              f"export SLURM_CONF={status.conf} to use sinfo, srun and scontrol here")
    if status.error:
        con.print(f"slurm: {escape(status.error)}")
    return status.up


@guarded
def up(nodes: int, slurm: bool = False, lab: Lab | None = None,
       out: TextIO | None = None) -> int:
    """Bring the lab to exactly ``nodes`` running nodes; with ``slurm``, run Slurm on it."""
    lab = lab or Lab()
    start = time.monotonic()
    statuses = lab.up(nodes, slurm=SlurmSettings() if slurm else None)
    con = terminal.console(out)
    con.print(_status_table(lab))
    slurm_up = _slurm_report(lab, con)
    con.print(f"lab {lab.config.name}: {sum(s.up for s in statuses)} of {nodes} nodes up in "
              f"{time.monotonic() - start:.1f}s; inventory {lab.config.inventory_dir}")
    return 0 if all(s.up for s in statuses) and slurm_up else 1


@guarded
def add(lab: Lab | None = None, out: TextIO | None = None) -> int:
    """Create one more node that is not yet in known_hosts."""
    lab = lab or Lab()
    node = lab.add()
    terminal.console(out).print(f"added {node.name} at {node.address} (its host key is not "
                                "in known_hosts yet: bootstrap it)")
    return 0


@guarded
def down(purge: bool = False, lab: Lab | None = None, out: TextIO | None = None) -> int:
    """Remove every namespace, mount, process and bridge of the lab."""
    lab = lab or Lab()
    lab.down(purge=purge)
    terminal.console(out).print(f"lab {lab.config.name} is down")
    return 0


@guarded
def status(lab: Lab | None = None, out: TextIO | None = None) -> int:
    """Show each node's namespaces, sshd and known_hosts state."""
    lab = lab or Lab()
    statuses = lab.status()
    con = terminal.console(out)
    if not statuses:
        con.print(f"lab {lab.config.name} has no nodes; run `invoke lab.up --nodes 3`")
        return 1
    con.print(_status_table(lab))
    slurm_up = _slurm_report(lab, con)
    return 0 if all(s.up for s in statuses) and slurm_up else 1


@guarded
def node_exec(node: str, command: str, lab: Lab | None = None) -> int:
    """Run ``command`` inside a node, streaming its output; return its exit status."""
    lab = lab or Lab()
    return subprocess.run(lab.exec_argv(node, command), check=False, stdout=sys.stdout,
                          stderr=sys.stderr).returncode


@guarded
def remove(node: str, lab: Lab | None = None, out: TextIO | None = None) -> int:
    """Destroy one node and drop it from the inventory and known_hosts."""
    lab = lab or Lab()
    lab.remove(node)
    terminal.console(out).print(f"removed {node}")
    return 0
