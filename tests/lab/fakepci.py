"""A PCI tree of an HGX-like node, and ``setpci`` over it, for the pcie suite and role on lab
nodes (which share the controller's kernel, and have no GPU, NIC or PCIe switch).

Under ROOT (the suite's and role's ``pcie_sys_root``): two PCIe switches, each under a root
port, each with a GPU (NVIDIA, class 0x0302) and a NIC (Mellanox; an InfiniBand one, class
0x0207, and an Ethernet one with its ``infiniband`` directory) on two of its downstream
ports, as on an HGX H100/H200 board; ``bus/pci/devices/<bdf>`` links into
``devices/pci0000:XX/...`` as the kernel's do; each GPU and NIC at x16 32 GT/s of x16 32 GT/s
in an IOMMU group of type ``identity``; one IOMMU (``class/iommu/dmar0``) and a command line
with ``iommu=pt``. The registers ``setpci`` would read from configuration space are files
beside each device: ``lab-acs-ctl`` (the ACS Control word; only the switches' downstream
ports and the root ports have the capability) and ``lab-devctl`` (a NIC's Device Control:
MaxReadReq 4096 bytes, relaxed ordering on). The stand-in ``setpci -s BDF REG[=VALUE[:MASK]]``
reads and writes them, and answers as setpci does where a device lacks the capability.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from gpufleet.lab.cluster import Lab
from tests.lab.conftest import node_sh

ROOT = "/var/lib/gpufleet-lab-pcie"
SWITCHES = {  # root port -> (upstream port, {downstream port: (endpoint, kind)})
    "0000:00:01.0": ("0000:01:00.0", {"0000:02:00.0": ("0000:03:00.0", "gpu"),
                                      "0000:02:01.0": ("0000:04:00.0", "ib")}),
    "0000:80:01.0": ("0000:81:00.0", {"0000:82:00.0": ("0000:83:00.0", "gpu"),
                                      "0000:82:01.0": ("0000:84:00.0", "eth")}),
}
GPUS = ("0000:03:00.0", "0000:83:00.0")
NICS = ("0000:04:00.0", "0000:84:00.0")
IDS = {"gpu": ("0x10de", "0x030200"), "ib": ("0x15b3", "0x020700"),
       "eth": ("0x15b3", "0x020000"), "bridge": ("0x1000", "0x060400")}
CMDLINE = "BOOT_IMAGE=/boot/vmlinuz ro quiet iommu=pt"
ACS_OFF = "0000"
ACS_ON = "001d"
"""``ACSCtl: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl-
DirectTrans-``: what a PLX/Broadcom switch's downstream port shows with ACS on (the NCCL
issues' captures in tests/fixtures/pcie)."""

SETPCI = f"""#!/bin/sh
# gpufleet lab stand-in for setpci: ACS Control and Device Control of the lab's PCI tree.
r={ROOT}
[ "$1" = -s ] && [ $# -eq 3 ] || {{
  echo "setpci: lab stand-in: -s BDF REG[=VALUE[:MASK]]" >&2; exit 1; }}
d=$r/sys/bus/pci/devices/$2
[ -e "$d" ] || {{ echo "setpci: Warning: No devices selected for operation group 1." >&2; exit 0; }}
case ${{3%%=*}} in
  ECAP_ACS+6.w) f=$d/lab-acs-ctl; cap="Extended capability 000d";;
  CAP_EXP+8.w) f=$d/lab-devctl; cap="Capability 0010";;
  *) echo "setpci: lab stand-in: no register ${{3%%=*}}" >&2; exit 1;;
esac
[ -f "$f" ] || {{
  echo "setpci: $2: Instance #0 of $cap not found - there are no capabilities with that id." >&2
  exit 1; }}
case $3 in
  *=*) v=${{3#*=}}; value=${{v%%:*}}; mask=${{v#*:}}; [ "$mask" = "$v" ] && mask=ffff
       old=$(cat "$f")
       printf '%04x\\n' $(( (0x$old & ~0x$mask) | (0x$value & 0x$mask) )) > "$f.new"
       mv "$f.new" "$f";;
  *) cat "$f";;
esac
"""


def _device(files: dict[str, str], links: dict[str, str], path: str, kind: str) -> None:
    vendor, klass = IDS[kind]
    address = path.rsplit("/", 1)[1]
    base = f"sys/devices/{path}"
    files.update({f"{base}/vendor": vendor, f"{base}/class": klass})
    links[f"sys/bus/pci/devices/{address}"] = f"../../../devices/{path}"
    if kind == "bridge":
        return
    files.update({f"{base}/current_link_width": "16", f"{base}/max_link_width": "16",
                  f"{base}/current_link_speed": "32.0 GT/s PCIe",
                  f"{base}/max_link_speed": "32.0 GT/s PCIe",
                  f"{base}/iommu_group/type": "identity"})
    if kind != "gpu":
        files[f"{base}/lab-devctl"] = "5957"  # MaxReadReq 4096, RlxdOrd+ (ConnectX-7)
    if kind == "eth":
        files[f"{base}/infiniband/mlx5_1/node_type"] = "1: CA"


def tree() -> tuple[dict[str, str], dict[str, str]]:
    """The healthy tree: files (path under ROOT -> content) and links (path -> target)."""
    files = {"proc/cmdline": CMDLINE, "sys/class/iommu/dmar0/type": "dmar"}
    links: dict[str, str] = {}
    for root_port, (upstream, downstream) in SWITCHES.items():
        domain = f"pci{root_port[:7]}"
        _device(files, links, f"{domain}/{root_port}", "bridge")
        files[f"sys/devices/{domain}/{root_port}/lab-acs-ctl"] = ACS_OFF
        above = f"{domain}/{root_port}/{upstream}"
        _device(files, links, above, "bridge")
        for port, (endpoint, kind) in downstream.items():
            _device(files, links, f"{above}/{port}", "bridge")
            files[f"sys/devices/{above}/{port}/lab-acs-ctl"] = ACS_OFF
            _device(files, links, f"{above}/{port}/{endpoint}", kind)
    return files, links


def device_dir(address: str) -> str:
    """A device's directory under ROOT (where its files are)."""
    _, links = tree()
    return "sys/" + links[f"sys/bus/pci/devices/{address}"].removeprefix("../../../")


def install_command(root: str = ROOT) -> str:
    """The shell that replaces the tree under ``root`` with the healthy one."""
    files, links = tree()
    directories = {f"{root}/{p.rsplit('/', 1)[0]}" for p in [*files, *links]}
    return " && ".join([
        f"rm -rf {shlex.quote(root)}",
        "mkdir -p " + " ".join(map(shlex.quote, sorted(directories))),
        *(f"echo {shlex.quote(content)} > {shlex.quote(f'{root}/{path}')}"
          for path, content in files.items()),
        *(f"ln -s {shlex.quote(target)} {shlex.quote(f'{root}/{path}')}"
          for path, target in links.items())])


def setpci_script(root: str = ROOT) -> str:
    """The stand-in setpci over the tree under ``root``."""
    return SETPCI.replace(f"r={ROOT}\n", f"r={shlex.quote(root)}\n")


def install(lab: Lab, node: str) -> None:
    """The healthy tree and the stand-in setpci on ``node``."""
    script = shlex.quote(setpci_script())
    node_sh(lab, node, " && ".join([
        install_command(), f"printf '%s' {script} > /usr/local/sbin/setpci",
        "chmod 755 /usr/local/sbin/setpci", "ln -sf /usr/local/sbin/setpci /usr/bin/setpci"]))


def write(lab: Lab, node: str, path: str, content: str) -> None:
    """Set a file of the tree on ``node`` (``path`` under ROOT)."""
    node_sh(lab, node, f"echo {shlex.quote(content)} > {shlex.quote(f'{ROOT}/{path}')}")


def materialise(root: Path) -> None:
    """The healthy tree under a local directory (for tests that run the fact's shell here)."""
    files, links = tree()
    for path, content in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(content + "\n")
    for path, target in links.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).symlink_to(target)
    script = root / "bin" / "setpci"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(setpci_script(str(root)))
    script.chmod(0o755)
