"""Lab commands behind ``invoke lab.*``: they print and return exit codes."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TextIO

from rich.table import Table

from gpufleet.app import guarded
from gpufleet.lab.cluster import Lab
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


@guarded
def up(nodes: int, lab: Lab | None = None, out: TextIO | None = None) -> int:
    """Bring the lab to exactly ``nodes`` running nodes."""
    lab = lab or Lab()
    start = time.monotonic()
    statuses = lab.up(nodes)
    con = terminal.console(out)
    con.print(_status_table(lab))
    con.print(f"lab {lab.config.name}: {sum(s.up for s in statuses)} of {nodes} nodes up in "
              f"{time.monotonic() - start:.1f}s; inventory {lab.config.inventory_dir}")
    return 0 if all(s.up for s in statuses) else 1


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
    return 0 if all(s.up for s in statuses) else 1


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
