"""Stand-ins for the kernel a lab node boots and for DKMS.

Lab nodes share the controller's kernel, so what a node "runs" is a stand-in: ``uname -r``
answers the kernel the node booted, the newest /boot/vmlinuz-* at the first call after a
boot (/run is emptied at every lab boot), as GRUB's default entry would boot it; the
controller's own release where /boot holds none. The kernels themselves are the kernel
role's stand-in packages (linux-image-*, linux-headers-* in the lab's repository), whose
maintainer scripts ask DKMS to build, as the real ones' hooks do.

The ``dkms`` stand-in builds the modules registered in /etc/gpufleet-lab/dkms/ for a kernel
whose headers are installed (/lib/modules/K/build): an ELF object per module whose
.modinfo carries that kernel's vermagic, which kmod's ``depmod`` indexes and ``modinfo``
reads as it reads a real module. ``dkms status`` reports them as dkms 3 does.
"""

from __future__ import annotations

import shlex

from gpufleet.lab.cluster import Lab
from tests.lab.conftest import node_sh

REGISTRY = "/etc/gpufleet-lab/dkms"
NVIDIA_MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem")

UNAME = """#!/bin/sh
# gpufleet lab stand-in for uname -r: the kernel this node booted.
if [ "$*" = -r ]; then
  f=/run/gpufleet-lab/kernel-release
  if [ ! -s "$f" ]; then
    k=$(ls /boot/vmlinuz-* 2>/dev/null | sed 's|^/boot/vmlinuz-||' | sort -V | tail -n1)
    mkdir -p /run/gpufleet-lab
    echo "${k:-$(/usr/bin/uname -r)}" > "$f.$$" && mv "$f.$$" "$f"
  fi
  exec cat "$f"
fi
exec /usr/bin/uname "$@"
"""

DKMS = r'''#!/usr/bin/python3
"""gpufleet lab stand-in for dkms: status, and autoinstall -k KERNEL."""
import os
import platform
import struct
import subprocess
import sys

REGISTRY = "@REGISTRY@"


def ko(name, version, release):
    """An ELF relocatable object with only a .modinfo section, as modinfo reads a module."""
    info = "".join(f"{k}={v}\0" for k, v in (
        ("version", version), ("license", "NVIDIA"), ("name", name.replace("-", "_")),
        ("vermagic", f"{release} SMP preempt mod_unload modversions"))).encode()
    names = b"\0.modinfo\0.shstrtab\0"
    table = (64 + len(info) + len(names) + 7) & ~7
    head = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8) + struct.pack(
        "<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, table, 0, 64, 0, 0, 64, 3, 2)
    body = head + info + names
    return (body + bytes(table - len(body)) + bytes(64) + section(1, 1, 64, len(info))
            + section(10, 3, 64 + len(info), len(names)))


def section(name, kind, at, size):
    """An ELF64 section header: name offset, type, at and size in the file."""
    return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, at, size, 0, 0, 1, 0)


def registered():
    for name in sorted(os.listdir(REGISTRY)):
        version, *modules = open(os.path.join(REGISTRY, name)).read().split()
        yield name, version, modules


def built(release, modules):
    return all(os.path.exists(f"/lib/modules/{release}/updates/dkms/{m}.ko") for m in modules)


def status():
    for name, version, modules in registered():
        trees = os.listdir("/lib/modules") if os.path.isdir("/lib/modules") else []
        kernels = sorted(k for k in trees if built(k, modules))
        if not kernels:
            print(f"{name}/{version}: added")
        for kernel in kernels:
            print(f"{name}/{version}, {kernel}, {platform.machine()}: installed")
    return 0


def autoinstall(release):
    if not os.path.exists(f"/lib/modules/{release}/build"):
        print(f"Error! Your kernel headers for kernel {release} cannot be found at "
              f"/lib/modules/{release}/build or /lib/modules/{release}/source.",
              file=sys.stderr)
        return 21
    target = f"/lib/modules/{release}/updates/dkms"
    os.makedirs(target, exist_ok=True)
    for name, version, modules in registered():
        for module in modules:
            with open(os.path.join(target, module + ".ko"), "wb") as out:
                out.write(ko(module, version, release))
    return subprocess.run(["depmod", "-a", release]).returncode


args = sys.argv[1:]
if args == ["status"]:
    sys.exit(status())
if len(args) == 3 and args[0] == "autoinstall" and args[1] in ("-k", "--kernelver"):
    sys.exit(autoinstall(args[2]))
print(f"gpufleet lab stand-in for dkms: {' '.join(args)} is not supported", file=sys.stderr)
sys.exit(2)
'''.replace("@REGISTRY@", REGISTRY)


def install(lab: Lab, node: str, driver: str = "550.127.05") -> None:
    """The stand-ins on ``node`` (its /usr/local, in its own overlay), with the driver's DKMS
    modules registered, and its running kernel fixed as the booted one."""
    register = " ".join(NVIDIA_MODULES)
    node_sh(lab, node, "\n".join([
        f"printf '%s' {shlex.quote(UNAME)} > /usr/local/bin/uname",
        f"printf '%s' {shlex.quote(DKMS)} > /usr/local/sbin/dkms",
        "chmod 755 /usr/local/bin/uname /usr/local/sbin/dkms",
        f"mkdir -p {REGISTRY} && echo {driver} {register} > {REGISTRY}/nvidia",
        "uname -r >/dev/null",
    ]))


def running(lab: Lab, node: str) -> str:
    """The kernel release ``node`` runs (its stand-in's answer)."""
    return node_sh(lab, node, "uname -r").strip()
