"""The lab's names, addresses and paths, and one node's: what the cluster and its Slurm
share, kept apart from the code that builds them so that neither imports the other."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import LabError

FIRST_BLOCK = 239  # nodes in the first /24: .11 to .249 (.250 and .251 are side namespaces)
PER_BLOCK = 240  # nodes in each further /24: .10 to .249
PREFIX = 16


@dataclass(frozen=True)
class LabConfig:
    """Names, addresses and paths of one lab; two labs with different names can coexist."""

    name: str = "gflab"
    root: Path = Path("/srv/gpufleet-lab")
    subnet: str = "10.77.0"
    inventory_dir: Path = Path("inventory/lab")
    wheelhouse: Path = Path("/srv/gpufleet-wheels")
    torch_requirement: str = "torch==2.13.0+cpu"

    @property
    def bridge(self) -> str:
        return f"{self.name}-br"

    @property
    def network(self) -> ipaddress.IPv4Network:
        """The bridge's network: the /16 that holds the lab's first /24."""
        return ipaddress.ip_network(f"{self.subnet}.0/{PREFIX}", strict=False)  # type: ignore[return-value]

    def address(self, index: int) -> str:
        """Node ``index``'s address: ``<subnet>.(10+index)`` up to node239, then 240 nodes to
        each following /24."""
        if index <= FIRST_BLOCK:
            return f"{self.subnet}.{10 + index}"
        a, b, c = (int(x) for x in self.subnet.split("."))
        block, offset = divmod(index - FIRST_BLOCK - 1, PER_BLOCK)
        if c + 1 + block > 255:
            raise LabError(f"node{index:02d} does not fit in {self.network}")
        return f"{a}.{b}.{c + 1 + block}.{10 + offset}"

    @property
    def controller_address(self) -> str:
        return f"{self.subnet}.1"

    @property
    def outsider_address(self) -> str:
        return f"{self.subnet}.250"

    @property
    def outsider_netns(self) -> str:
        return f"{self.name}-outside"

    @property
    def second_controller_address(self) -> str:
        return f"{self.subnet}.251"

    @property
    def key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    @property
    def anchor_pidfile(self) -> Path:
        """A process left in the controller's namespaces, through which a node's reboot
        stand-in reaches the lab (PID 1's namespaces may not be open to it)."""
        return self.root / "anchor.pid"

    @property
    def nsdir(self) -> Path:
        return self.root / "ns"

    @property
    def nodes_dir(self) -> Path:
        return self.root / "nodes"


@dataclass(frozen=True)
class Node:
    """One lab node, identified by its index (node01 is index 1)."""

    lab: LabConfig
    index: int

    @property
    def name(self) -> str:
        return f"node{self.index:02d}"

    @property
    def address(self) -> str:
        return self.lab.address(self.index)

    @property
    def netns(self) -> str:
        return f"{self.lab.name}-{self.name}"

    @property
    def veth(self) -> str:
        return f"{self.lab.name}-v{self.index}"

    @property
    def dir(self) -> Path:
        return self.lab.nodes_dir / self.name

    @property
    def mnt_ns(self) -> Path:
        return self.lab.nsdir / f"{self.name}.mnt"

    @property
    def uts_ns(self) -> Path:
        return self.lab.nsdir / f"{self.name}.uts"

    @property
    def sshd_pidfile(self) -> Path:
        return self.dir / "sshd.pid"

    @property
    def host_key_pub(self) -> Path:
        return self.dir / "upper" / "etc" / "ssh" / "ssh_host_ed25519_key.pub"

    def nsenter(self) -> list[str]:
        """The command prefix that enters this node's namespaces from the controller."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", f"--mount={self.mnt_ns}",
                f"--uts={self.uts_ns}", "--"]
