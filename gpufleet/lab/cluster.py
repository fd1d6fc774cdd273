"""The local lab cluster: nodes in network namespaces with their own sshd and overlay root.

Each node is a network namespace on a bridge the lab creates (a /16: node01-node239 keep
their addresses in the lab's first /24, ``<subnet>.11``-``.249``, and further nodes fill
the next /24s, 240 to each), plus a persistent
mount and UTS namespace (bound under ``<root>/ns``) in which /etc, /var, /opt,
/usr and /root are copy-on-write overlays of the controller's directories, /tmp,
/run and /dev/shm are private, and its own sshd listens on the node's address.
"""

from __future__ import annotations

import fcntl
import ipaddress
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

import yaml

from gpufleet.errors import LabError
from gpufleet.lab import localcmd
from gpufleet.lab.boot import OVERLAID, boot_script
from gpufleet.lab.model import PREFIX, LabConfig, Node
from gpufleet.lab.namespaces import (
    cmdline,
    kill_all,
    link_exists,
    mounted,
    netns_exists,
    ns_inode,
    pid_alive,
    pids_in_namespaces,
)
from gpufleet.lab.repo import KEYRING, build_repo, repo_dir
from gpufleet.lab.slurm import LabSlurm, SlurmSettings

MAX_NODES = 1000
# The kernel's neighbour table is shared by every namespace: a lab of N nodes that all talk
# to each other needs about N*N entries (the default hard limit is 1024).
NEIGH_PER_NODE_PAIR = 2
REQUIRED_TOOLS = ("ip", "nsenter", "unshare", "mount", "umount", "sshd", "ssh-keygen",
                  "dpkg-deb", "dpkg-scanpackages", "nft")
INSTALL_HINT = ("install them with: apt-get install iproute2 util-linux openssh-server dpkg-dev "
                "nftables")


@dataclass(frozen=True)
class NodeStatus:
    """What lab.status reports for one node."""

    name: str
    address: str
    netns: bool
    mounted: bool
    sshd_pid: int | None
    in_known_hosts: bool

    @property
    def up(self) -> bool:
        return self.netns and self.mounted and self.sshd_pid is not None


def discard(path: Path, trash: Path) -> None:
    """Remove ``path`` at once and its files in the background: it is renamed into ``trash``
    (one file system) and deleted there by a detached, low-priority ``rm``. A provisioned
    node holds tens of thousands of files (its torch); unlinking them on a file system
    mounted with ``discard`` took seconds a node, and a loaded machine's lab tear-down
    minutes."""
    if not path.exists():
        return
    trash.mkdir(parents=True, exist_ok=True)
    target = trash / f"{path.name}-{uuid.uuid4().hex}"
    try:
        path.rename(target)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        return
    prefix = ["ionice", "-c3"] if shutil.which("ionice") else []
    subprocess.Popen([*prefix, "nice", "-n19", "rm", "-rf", "--one-file-system", str(target)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)


P = ParamSpec("P")
R = TypeVar("R")


def _exclusive(method: Callable[Concatenate[Lab, P], R]) -> Callable[Concatenate[Lab, P], R]:
    """Serialise changes to one lab across processes (a lock file in its state directory);
    only root may take the lock."""
    def wrapper(self: Lab, /, *args: P.args, **kwargs: P.kwargs) -> R:
        localcmd.require_root("the lab")
        self.config.root.mkdir(parents=True, exist_ok=True)
        with open(self.config.root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return method(self, *args, **kwargs)
    wrapper.__doc__ = method.__doc__
    return wrapper


def _node_exclusive(method: Callable[Concatenate[Lab, str, P], R]
                    ) -> Callable[Concatenate[Lab, str, P], R]:
    """Serialise changes to one node, while other nodes change in parallel: a shared lock
    on the lab (lab.up and lab.down wait for it) and an exclusive one on the node."""
    def wrapper(self: Lab, name: str, /, *args: P.args, **kwargs: P.kwargs) -> R:
        localcmd.require_root("the lab")
        self.config.root.mkdir(parents=True, exist_ok=True)
        with open(self.config.root / ".lock", "w") as lab_lock:
            fcntl.flock(lab_lock, fcntl.LOCK_SH)
            node = self.node(name)
            with open(node.dir / ".lock", "w") as node_lock:
                fcntl.flock(node_lock, fcntl.LOCK_EX)
                return method(self, name, *args, **kwargs)
    wrapper.__doc__ = method.__doc__
    return wrapper


class Lab:
    """Bring a lab up, inspect it, run commands on its nodes and tear it down."""

    def __init__(self, config: LabConfig | None = None) -> None:
        self.config = config or LabConfig()
        root = self.config.root.resolve()
        hidden = [d for d in (*OVERLAID, "tmp", "boot", "run", "dev", "proc", "sys")
                  if root == Path("/", d) or Path("/", d) in root.parents]
        if hidden or root == Path("/"):
            raise LabError(f"lab root {root} must not lie under /{hidden[0] if hidden else ''}: "
                           "nodes see their own copy of that directory")

    # ---- discovery -------------------------------------------------------------------

    def node(self, name: str) -> Node:
        """The node called ``name`` (``node03`` or ``3``); LabError if the lab has none."""
        match = re.fullmatch(r"(?:node)?0*(\d+)", name)
        if not match:
            raise LabError(f"no lab node named {name!r} (nodes are node01, node02, ...)")
        node = Node(self.config, int(match.group(1)))
        if not node.dir.is_dir():
            raise LabError(f"no lab node named {name!r}; run `invoke lab.status` to list them")
        return node

    def nodes(self) -> list[Node]:
        """Every node the lab has created, in index order."""
        if not self.config.nodes_dir.is_dir():
            return []
        indexes = sorted(int(m.group(1)) for d in self.config.nodes_dir.iterdir()
                         if (m := re.fullmatch(r"node(\d+)", d.name)))
        return [Node(self.config, i) for i in indexes]

    def status(self) -> list[NodeStatus]:
        """Per-node state as seen from the controller."""
        known_addrs = self._known_addresses()
        return [
            NodeStatus(
                name=n.name,
                address=n.address,
                netns=netns_exists(n.netns),
                mounted=mounted(n.mnt_ns),
                sshd_pid=pid_alive(n.sshd_pidfile),
                in_known_hosts=n.address in known_addrs,
            )
            for n in self.nodes()
        ]

    # ---- bring up --------------------------------------------------------------------

    @_exclusive
    def up(self, count: int, slurm: SlurmSettings | None = None) -> list[NodeStatus]:
        """Converge the lab to exactly ``count`` running nodes (idempotent); with ``slurm``,
        also run Slurm over them (kept running once started)."""
        self._preflight()
        if not 1 <= count <= MAX_NODES:
            raise LabError(f"--nodes must be between 1 and {MAX_NODES}, got {count}")
        self._prepare_controller()
        self._size_neighbour_table(count)
        for node in self.nodes():
            if node.index > count:
                self._destroy_node(node)
        for index in range(1, count + 1):
            self._ensure_node(Node(self.config, index))
        self._write_known_hosts(self.nodes())
        self._write_inventory()
        LabSlurm(self.config).converge(self.nodes(), slurm)
        return self.status()

    @_exclusive
    def add(self) -> Node:
        """Create one more node, in the inventory but NOT in known_hosts (a fresh machine)."""
        self._preflight()
        self._prepare_controller()
        existing = self.nodes()
        index = (existing[-1].index + 1) if existing else 1
        if index > MAX_NODES:
            raise LabError(f"the lab holds at most {MAX_NODES} nodes")
        node = Node(self.config, index)
        self._ensure_node(node)
        self._write_inventory()
        LabSlurm(self.config).converge(self.nodes())
        return node

    @_exclusive
    def remove(self, name: str) -> None:
        """Destroy one node and drop it from the inventory and known_hosts.

        The controller and the other nodes forget its MAC address, so that a node added
        later at the same address is reachable at once."""
        self._preflight()
        self._destroy_node(self.node(name))
        self._write_known_hosts([n for n in self.nodes() if n.host_key_pub.exists()
                                 and n.address in self._known_addresses()])
        self._write_inventory()
        LabSlurm(self.config).converge(self.nodes())

    def _repo_dir(self) -> Path:
        return repo_dir(self.config.repo)

    def _known_addresses(self) -> set[str]:
        known = self.config.known_hosts
        text = known.read_text() if known.exists() else ""
        return {line.split()[0] for line in text.splitlines() if line.strip()}

    def reboot(self, name: str, delay: float = 0.0) -> None:
        """Stop every process of a node and boot it again from its persistent overlay;
        other nodes may reboot at the same time."""
        time.sleep(delay)
        self._reboot(name)

    @_node_exclusive
    def _reboot(self, name: str) -> None:
        self._preflight()
        node = self.node(name)
        self._stop_node(node)
        self._boot(node)

    def _preflight(self) -> None:
        localcmd.require_root("the lab")
        localcmd.require_tools(REQUIRED_TOOLS, INSTALL_HINT)

    def _prepare_controller(self) -> None:
        cfg = self.config
        for path in (cfg.root, cfg.nodes_dir, cfg.nsdir):
            path.mkdir(parents=True, exist_ok=True)
        if not mounted(cfg.nsdir):
            localcmd.run(["mount", "--bind", str(cfg.nsdir), str(cfg.nsdir)])
            localcmd.run(["mount", "--make-private", str(cfg.nsdir)])
        if not cfg.key.exists():
            localcmd.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                          f"gpufleet-lab-{cfg.name}", "-f", str(cfg.key)])
        build_repo(cfg.repo)
        prepare_wheelhouse(cfg.wheelhouse, cfg.torch_requirement)
        self._ensure_anchor()
        if not link_exists(cfg.bridge):
            self._check_subnet_free()
            localcmd.run(["ip", "link", "add", cfg.bridge, "type", "bridge"])
            localcmd.run(["ip", "addr", "add", f"{cfg.controller_address}/{PREFIX}", "dev",
                          cfg.bridge])
        localcmd.run(["ip", "link", "set", cfg.bridge, "up"])

    def _ensure_anchor(self) -> None:
        pidfile = self.config.anchor_pidfile
        pid = pid_alive(pidfile)
        if pid is not None and cmdline(pid) == ["sleep", "infinity"]:
            return
        proc = subprocess.Popen(["sleep", "infinity"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        pidfile.write_text(f"{proc.pid}\n")

    def _check_subnet_free(self) -> None:
        network = self.config.network
        for line in localcmd.run(["ip", "-4", "route", "show"]).stdout.splitlines():
            first = line.split()[0] if line.split() else ""
            try:
                routed = ipaddress.ip_network(first, strict=False)
            except ValueError:
                continue
            if routed.prefixlen > 0 and routed.overlaps(network):
                raise LabError(f"the lab's network {network} overlaps {routed}, already routed "
                               "on this machine; choose another lab subnet")

    @staticmethod
    def _size_neighbour_table(count: int) -> None:
        """Raise the kernel's neighbour table limits (never lower them) to what ``count``
        nodes talking to each other need."""
        needed = NEIGH_PER_NODE_PAIR * count * count
        for name, share in (("gc_thresh1", 8), ("gc_thresh2", 2), ("gc_thresh3", 1)):
            path = Path("/proc/sys/net/ipv4/neigh/default") / name
            try:
                current = int(path.read_text())
            except (OSError, ValueError):
                return
            if current < needed // share:
                path.write_text(f"{needed // share}\n")

    def _ensure_node(self, node: Node) -> None:
        """Start a node that is not running. A node whose network namespace and link
        survive (only its sshd or mounts died) is booted again inside them, so its
        nftables rules and net sysctls stay as they were."""
        if self._node_running(node):
            return
        if netns_exists(node.netns) and link_exists(node.veth) and node.dir.is_dir():
            self._stop_node(node)
            self._boot(node)
            return
        self._destroy_node(node, keep_files=node.dir.is_dir())
        self._create_netns(node)
        self._boot(node)

    def _node_running(self, node: Node) -> bool:
        return (netns_exists(node.netns) and mounted(node.mnt_ns)
                and pid_alive(node.sshd_pidfile) is not None and node.host_key_pub.exists())

    def _create_netns(self, node: Node) -> None:
        cfg = self.config
        localcmd.run(["ip", "netns", "add", node.netns])
        localcmd.run(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0",
                      "netns", node.netns])
        localcmd.run(["ip", "link", "set", node.veth, "master", cfg.bridge, "up"])
        ns = ["ip", "-n", node.netns]
        localcmd.run([*ns, "addr", "add", f"{node.address}/{PREFIX}", "dev", "eth0"])
        localcmd.run([*ns, "link", "set", "eth0", "up"])
        localcmd.run([*ns, "link", "set", "lo", "up"])

    def _boot(self, node: Node) -> None:
        """Create the node's mount/UTS namespaces over its overlay and start its sshd."""
        for sub in ("tmp", "boot", *(f"upper/{d}" for d in OVERLAID),
                    *(f"work/{d}" for d in OVERLAID)):
            (node.dir / sub).mkdir(parents=True, exist_ok=True)
        (node.dir / "tmp").chmod(0o1777)
        for ns_file in (node.mnt_ns, node.uts_ns):
            ns_file.touch()
        script = boot_script(self.config, node)
        localcmd.run(["nsenter", f"--net=/run/netns/{node.netns}", "unshare",
                      f"--mount={node.mnt_ns}", f"--uts={node.uts_ns}", "--propagation",
                      "private", "sh", "-ec", script], timeout=60)
        deadline = time.monotonic() + 10
        while pid_alive(node.sshd_pidfile) is None:
            if time.monotonic() > deadline:
                raise LabError(f"{node.name}: sshd did not start (see {node.dir}/sshd.log)")
            time.sleep(0.05)
        LabSlurm(self.config).node_booted(node)

    # ---- tear down -------------------------------------------------------------------

    @_exclusive
    def down(self, purge: bool = False) -> None:
        """Remove every namespace, mount, process, link and bridge of the lab."""
        localcmd.require_tools(("ip", "umount"), INSTALL_HINT)
        cfg = self.config
        LabSlurm(cfg).stop()
        nodes = self.nodes()
        self._stop_everything(nodes)
        for node in nodes:
            self._destroy_node(node, forget=False)
        for name in self._stray_netns():
            self._delete_netns(name)
        if link_exists(cfg.bridge):
            localcmd.run(["ip", "link", "del", cfg.bridge])
        if mounted(cfg.nsdir):
            localcmd.run(["umount", str(cfg.nsdir)])
        anchor = pid_alive(cfg.anchor_pidfile)
        if anchor is not None and cmdline(anchor) == ["sleep", "infinity"]:
            kill_all([anchor])
        cfg.anchor_pidfile.unlink(missing_ok=True)
        discard(cfg.nodes_dir, self._trash)
        shutil.rmtree(cfg.nsdir, ignore_errors=True)
        cfg.known_hosts.unlink(missing_ok=True)
        (cfg.inventory_dir / "hosts.yml").unlink(missing_ok=True)
        if purge:
            discard(cfg.root, self._trash)

    @property
    def _trash(self) -> Path:
        """Where removed node trees wait for their background ``rm`` (beside the lab's
        root: the same file system)."""
        return self.config.root.with_name(f"{self.config.root.name}.trash")

    def _stray_netns(self) -> list[str]:
        prefix = f"{self.config.name}-"
        run_netns = Path("/run/netns")
        if not run_netns.is_dir():
            return []
        return sorted(p.name for p in run_netns.iterdir() if p.name.startswith(prefix))

    def _stop_everything(self, nodes: list[Node]) -> None:
        """End every process of every node in one pass over /proc (a large lab's tear-down
        would otherwise scan /proc twice per node)."""
        inodes = {i for n in nodes for i in (ns_inode(n.mnt_ns) if mounted(n.mnt_ns) else None,
                                             ns_inode(Path("/run/netns", n.netns)))
                  if i is not None}
        if inodes:
            kill_all(pids_in_namespaces(inodes), inodes)

    def _stop_node(self, node: Node) -> None:
        inodes = {i for i in (ns_inode(node.mnt_ns) if mounted(node.mnt_ns) else None,
                              ns_inode(Path("/run/netns", node.netns))) if i is not None}
        if inodes:
            kill_all(pids_in_namespaces(inodes), inodes)
        for ns_file in (node.mnt_ns, node.uts_ns):
            if mounted(ns_file):
                localcmd.run(["umount", str(ns_file)])
        node.sshd_pidfile.unlink(missing_ok=True)

    def _destroy_node(self, node: Node, keep_files: bool = False, forget: bool = True) -> None:
        """Stop a node and delete its namespaces and link; with ``forget``, the controller
        and the other nodes drop its MAC address (a node made again at the address must be
        reachable at once)."""
        existed = netns_exists(node.netns) or link_exists(node.veth)
        self._stop_node(node)
        self._delete_netns(node.netns)
        if forget and existed:
            localcmd.run(["ip", "neigh", "flush", "to", node.address], check=False)
            for other in self.nodes():
                if other.index != node.index and netns_exists(other.netns):
                    localcmd.run(["ip", "-n", other.netns, "neigh", "flush", "to",
                                  node.address], check=False)
        if link_exists(node.veth):
            localcmd.run(["ip", "link", "del", node.veth], check=False)
        if not keep_files:
            discard(node.dir, self._trash)
            for ns_file in (node.mnt_ns, node.uts_ns):
                ns_file.unlink(missing_ok=True)

    def _delete_netns(self, name: str) -> None:
        inode = ns_inode(Path("/run/netns", name))
        if inode is None:
            return
        kill_all(pids_in_namespaces({inode}), {inode})
        localcmd.run(["ip", "netns", "del", name])

    # ---- side namespaces: addresses on the lab bridge that are not nodes ---------------

    def outsider(self) -> str:
        """Ensure a namespace on the bridge outside the cluster; return its netns name."""
        cfg = self.config
        return self._side_namespace(cfg.outsider_netns, "vout", cfg.outsider_address)

    def second_controller(self) -> str:
        """Ensure a namespace on the bridge from which gpufleet can run as a second
        controller (address ``<subnet>.251``, not a node); return its netns name."""
        cfg = self.config
        return self._side_namespace(f"{cfg.name}-ctl2", "vctl2", cfg.second_controller_address)

    def _side_namespace(self, name: str, veth_suffix: str, address: str) -> str:
        self._preflight()
        cfg = self.config
        if not netns_exists(name):
            veth = f"{cfg.name}-{veth_suffix}"
            localcmd.run(["ip", "netns", "add", name])
            localcmd.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                          "netns", name])
            localcmd.run(["ip", "link", "set", veth, "master", cfg.bridge, "up"])
            localcmd.run(["ip", "-n", name, "addr", "add", f"{address}/{PREFIX}", "dev", "eth0"])
            localcmd.run(["ip", "-n", name, "link", "set", "eth0", "up"])
            localcmd.run(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    # ---- commands on nodes -------------------------------------------------------------

    def exec_argv(self, name: str, command: str) -> list[str]:
        """The argv that runs ``command`` through sh inside node ``name``."""
        node = self.node(name)
        if not mounted(node.mnt_ns):
            raise LabError(f"{node.name} is not running; run `invoke lab.up`")
        return [*node.nsenter(), "sh", "-c", command]

    @_exclusive
    def power_off(self, name: str) -> None:
        """Stop a node abruptly: every process killed, its link down (disk kept)."""
        self._preflight()
        node = self.node(name)
        self._stop_node(node)
        localcmd.run(["ip", "link", "set", node.veth, "down"])

    @_exclusive
    def power_on(self, name: str) -> None:
        """Boot a node that was powered off."""
        self._preflight()
        node = self.node(name)
        localcmd.run(["ip", "link", "set", node.veth, "up"])
        if not mounted(node.mnt_ns):
            self._boot(node)

    def set_link(self, name: str, up: bool) -> None:
        """Take a node's link down (unreachable) or bring it back up."""
        node = self.node(name)
        localcmd.run(["ip", "link", "set", node.veth, "up" if up else "down"])

    # ---- files the rest of gpufleet reads --------------------------------------------

    def _write_known_hosts(self, nodes: list[Node]) -> None:
        lines = []
        for node in nodes:
            key = node.host_key_pub.read_text().split()
            lines.append(f"{node.address} {key[0]} {key[1]}")
        _write_atomic(self.config.known_hosts, "\n".join(lines) + "\n")

    def _write_inventory(self) -> None:
        cfg = self.config
        hosts = {n.name: {"ansible_host": n.address} for n in self.nodes()}
        data = {
            "all": {
                "vars": {
                    "ansible_user": "root",
                    "ansible_ssh_private_key_file": str(cfg.key),
                    "gpufleet_known_hosts": str(cfg.known_hosts),
                    "gpufleet_controllers": [cfg.controller_address],
                    "nvidia_repo_url": f"file:{self._repo_dir()}/",
                    "nvidia_repo_keyring": str(cfg.repo / KEYRING),
                },
                "children": {"lab": {"hosts": hosts}},
            }
        }
        header = ("# Generated by `invoke lab.up` for the lab cluster; do not edit.\n"
                  "# Stack pins and role variables live in group_vars/.\n")
        _write_atomic(cfg.inventory_dir / "hosts.yml",
                      header + yaml.safe_dump(data, sort_keys=False))


def prepare_wheelhouse(wheelhouse: Path, requirement: str) -> None:
    """Download the wheels the pytorch role installs on nodes, which have no internet."""
    stamp = wheelhouse / ".gpufleet-wheelhouse"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    with open(wheelhouse / ".lock", "w") as lock:  # labs coming up at once download it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.is_file() and stamp.read_text().strip() == requirement:
            return
        localcmd.run([sys.executable, "-m", "pip", "download", "--quiet",
                      "--only-binary=:all:", "--dest", str(wheelhouse), requirement],
                     timeout=1800)
        stamp.write_text(requirement + "\n")


