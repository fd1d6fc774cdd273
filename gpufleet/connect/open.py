"""``connect``: the SSH or local connection a host's inventory asks for."""

from __future__ import annotations

from gpufleet.connect.connection import Budget, ConnectOptions
from gpufleet.connect.local import LocalConnection
from gpufleet.connect.ssh import SSHConnection
from gpufleet.inventory.model import Host


def connect(host: Host, options: ConnectOptions | None = None, budget: Budget | None = None
            ) -> SSHConnection | LocalConnection:
    """A connection of the kind the host's ``ansible_connection`` asks for."""
    if host.connection == "local":
        return LocalConnection(host, budget)
    return SSHConnection(host, options, budget)
