"""A sysfs counter tree on lab nodes, which tests move: lab nodes have no RDMA NIC, GPU or AER
files, so gpufleet-watch reads this tree (its ``sys_root``, the slurm_healthcheck role's
``node_watch_sys_root``) in their place.

The tree has the layout and file formats of the kernel's: two mlx5 ports (``mlx5_0/1``
InfiniBand, ``mlx5_1/1`` RoCE with its ``hw_counters``) under ``class/infiniband``, and under
``bus/pci/devices`` the stand-in GPUs of tests/lab/fakegpu.py (NVIDIA, class 0x0302, at the
bus ids of its capture) and the two NICs (Mellanox, class 0x0207 and 0x0200), each with its
``aer_dev_*`` files and link width and speed. Paths are relative to the tree's root.
"""

from __future__ import annotations

import shlex

from gpufleet.lab.cluster import Lab
from tests.lab.conftest import node_sh

ROOT = "/var/lib/gpufleet-lab-sys"
PORTS = {"mlx5_0/1": "InfiniBand", "mlx5_1/1": "Ethernet"}
GPUS = ("0000:00:06.0", "0000:00:07.0")  # fakegpu's capture: nvidia-smi's bus ids
NICS = {"0000:00:08.0": "mlx5_0", "0000:00:09.0": "mlx5_1"}
COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
            "port_rcv_remote_physical_errors", "port_xmit_discards",
            "local_link_integrity_errors", "excessive_buffer_overrun_errors",
            "port_rcv_data", "port_xmit_data")
HW_COUNTERS = ("out_of_sequence", "packet_seq_err", "roce_slow_restart",
               "roce_adp_retrans", "rnr_nak_retry_err")
# The lines of each aer_dev_* file before its total (Linux's aer.c names, in its order).
AER = {
    "correctable": ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr",
                    "CorrIntErr", "HeaderOF", "TOTAL_ERR_COR"),
    "nonfatal": ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt",
                 "UnxCmplt", "RxOF", "MalfTLP", "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr",
                 "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr", "PoisonTLPBlocked",
                 "TOTAL_ERR_NONFATAL"),
}
AER["fatal"] = (*AER["nonfatal"][:-1], "TOTAL_ERR_FATAL")
# A component line that moves with each total (a receiver error, a data link protocol error).
AER_CAUSE = {"correctable": "RxErr", "nonfatal": "CmpltTO", "fatal": "DLP"}


def port(name: str) -> str:
    """``mlx5_0/1`` -> its directory in the tree."""
    device, number = name.split("/")
    return f"class/infiniband/{device}/ports/{number}"


def counter(name: str, which: str) -> str:
    """A port's counter file: ``counters/<which>`` or, for RoCE's, ``hw_counters/<which>``."""
    group = "hw_counters" if which in HW_COUNTERS else "counters"
    return f"{port(name)}/{group}/{which}"


def device(address: str) -> str:
    return f"bus/pci/devices/{address}"


def aer_text(kind: str, total: int) -> str:
    """An ``aer_dev_<kind>`` file whose total is ``total`` (all of it one cause)."""
    return "".join(f"{name} {total if name in (AER_CAUSE[kind], AER[kind][-1]) else 0}\n"
                   for name in AER[kind])


def tree() -> dict[str, str]:
    """The healthy tree: every file's path and content."""
    files: dict[str, str] = {}
    for name, layer in PORTS.items():
        base = port(name)
        files.update({f"{base}/state": "4: ACTIVE\n", f"{base}/phys_state": "5: LinkUp\n",
                      f"{base}/link_layer": f"{layer}\n",
                      f"{base}/rate": "400 Gb/sec (4X NDR)\n" if layer == "InfiniBand"
                      else "400 Gb/sec (4X HDR)\n"})
        files.update({counter(name, c): "0\n" for c in COUNTERS})
        if layer == "Ethernet":
            files.update({counter(name, c): "0\n" for c in HW_COUNTERS})
    pci = {**{a: ("0x10de", "0x030200", "32.0 GT/s PCIe") for a in GPUS},
           **{a: ("0x15b3", "0x020700" if NICS[a] == "mlx5_0" else "0x020000",
                  "32.0 GT/s PCIe") for a in NICS}}
    for address, (vendor, klass, speed) in pci.items():
        base = device(address)
        files.update({f"{base}/vendor": f"{vendor}\n", f"{base}/class": f"{klass}\n",
                      f"{base}/current_link_width": "16\n", f"{base}/max_link_width": "16\n",
                      f"{base}/current_link_speed": f"{speed}\n",
                      f"{base}/max_link_speed": f"{speed}\n"})
        files.update({f"{base}/aer_dev_{kind}": aer_text(kind, 0) for kind in AER})
        if address in NICS:
            files[f"{base}/infiniband/{NICS[address]}/node_type"] = "1: CA\n"
    return files


def write(lab: Lab, node: str, files: dict[str, str]) -> None:
    """Write ``files`` (path relative to the tree -> content) on ``node``, each atomically
    (the watch may be reading)."""
    commands = []
    for path, content in files.items():
        target = shlex.quote(f"{ROOT}/{path}")
        commands.append(f"printf '%s' {shlex.quote(content)} > {target}.new && "
                        f"mv {target}.new {target}")
    node_sh(lab, node, " && ".join(commands))


def install_command() -> str:
    """The shell command that replaces the node's tree with the healthy one."""
    files = tree()
    directories = sorted({f"{ROOT}/{path.rsplit('/', 1)[0]}" for path in files})
    return " && ".join([f"rm -rf {ROOT}", "mkdir -p " + " ".join(map(shlex.quote, directories)),
                        *(f"printf '%s' {shlex.quote(content)} > {shlex.quote(f'{ROOT}/{path}')}"
                          for path, content in files.items())])


def install(lab: Lab, node: str) -> None:
    """The healthy tree on ``node``, replacing any other."""
    node_sh(lab, node, install_command())


def add(lab: Lab, node: str, path: str, by: int) -> None:
    """Add ``by`` to the counter file ``path`` on ``node``."""
    target = shlex.quote(f"{ROOT}/{path}")
    node_sh(lab, node, f"echo $(( $(cat {target}) + {int(by)} )) > {target}.new && "
                       f"mv {target}.new {target}")


def remove(lab: Lab, node: str) -> None:
    node_sh(lab, node, f"rm -rf {ROOT}")
