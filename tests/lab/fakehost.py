"""Stand-ins of the host-wide kernel state and the RoCE NICs a lab node lacks.

Lab nodes share the controller's kernel: its CPU frequency governors, automatic NUMA
balancing, swap, transparent huge pages, C-state limits and default neighbour table are the
controller's, and a node has no RDMA NIC. ``install`` gives a node its own:

- a tree under KERNEL_ROOT (``kernel_state_root`` of the roles), seeded at every boot by a
  boot hook with what a kernel sets there by itself (schedutil on two CPUs, NUMA balancing
  on, no swap, THP madvise, intel_idle allowing C9, the kernel's neighbour thresholds, ECN
  off on every port): /run is emptied at a lab node's reboot, as sysfs and procfs are;
- two fabric interfaces in one subnet (FABRIC_SUBNET): veths whose peers stay in the node
  (the lab's kernel has no dummy driver), which keep their ARP sysctls, the network
  namespace's own, over a lab reboot;
- ``mlnx_qos``, answering in the layout of a real ConnectX-7 capture
  (tests/fixtures/published), its trust and PFC kept in /run (the NIC forgets them at a
  reboot: trust pcp, no PFC), and ``swapoff``, which takes a swap off the stand-in
  /proc/swaps (the real one would act on the controller's kernel).
"""

from __future__ import annotations

import shlex

from gpufleet.lab.boot import BOOT_HOOKS
from gpufleet.lab.cluster import Lab
from tests.conftest import FIXTURES
from tests.lab.conftest import node_sh

KERNEL_ROOT = "/run/gpufleet-lab/kernel"
QOS_STATE = "/run/gpufleet-lab/qos"
PORTS = ("fab0", "fab1")
FABRIC_SUBNET = "198.51.100"
CX7 = FIXTURES / "published" / "mlnx-qos-i-connectx7-mlnx-ofed-23.10-ets-strict-pfc5.txt"
HOOK = f"{BOOT_HOOKS}/10-kernel-state"
SWAPS_HEADER = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority"

SEED = f"""#!/bin/sh
# gpufleet lab stand-in: the host-wide kernel state a node's kernel sets at boot.
r={KERNEL_ROOT}
set -e
for c in 0 1; do
  mkdir -p $r/sys/devices/system/cpu/cpu$c/cpufreq
  echo schedutil > $r/sys/devices/system/cpu/cpu$c/cpufreq/scaling_governor
done
echo acpi-cpufreq > $r/sys/devices/system/cpu/cpu0/cpufreq/scaling_driver
echo 'conservative ondemand userspace powersave performance schedutil' \\
  > $r/sys/devices/system/cpu/cpu0/cpufreq/scaling_available_governors
mkdir -p $r/proc/sys/kernel $r/sys/kernel/mm/transparent_hugepage \\
  $r/sys/devices/system/cpu/cpuidle $r/sys/module/intel_idle/parameters \\
  $r/sys/module/processor/parameters $r/proc/sys/net/ipv4/neigh/default
echo 1 > $r/proc/sys/kernel/numa_balancing
echo 'always [madvise] never' > $r/sys/kernel/mm/transparent_hugepage/enabled
echo 'always defer defer+madvise [madvise] never' > $r/sys/kernel/mm/transparent_hugepage/defrag
echo intel_idle > $r/sys/devices/system/cpu/cpuidle/current_driver
echo 9 > $r/sys/module/intel_idle/parameters/max_cstate
echo 9 > $r/sys/module/processor/parameters/max_cstate
echo 'BOOT_IMAGE=/boot/vmlinuz ro quiet' > $r/proc/cmdline
echo 128 > $r/proc/sys/net/ipv4/neigh/default/gc_thresh1
echo 512 > $r/proc/sys/net/ipv4/neigh/default/gc_thresh2
echo 1024 > $r/proc/sys/net/ipv4/neigh/default/gc_thresh3
printf '%s\\n' {shlex.quote(SWAPS_HEADER)} > $r/proc/swaps
for p in {' '.join(PORTS)}; do for k in roce_np roce_rp; do
  mkdir -p $r/sys/class/net/$p/ecn/$k/enable
  for i in 0 1 2 3 4 5 6 7; do echo 0 > $r/sys/class/net/$p/ecn/$k/enable/$i; done
done; done
"""

# mlnx_qos -i PORT [--trust pcp|dscp] [--pfc a,b,c,d,e,f,g,h]: sets what it is given, then
# prints the port's state in the layout of the ConnectX-7 capture (under pcp trust without
# its dscp2prio block, as mlnx_qos prints it).
MLNX_QOS = f"""#!/usr/bin/python3
# gpufleet lab stand-in for mlnx_qos: a ConnectX-7's QoS, forgotten at a reboot.
import json, os, re, sys
args = sys.argv[1:]
def option(name):
    return args[args.index(name) + 1] if name in args else None
port = option("-i")
if not port or not os.path.isdir("/sys/class/net/" + port):
    print("Netlink error: No such device"); sys.exit(1)
path = "{QOS_STATE}/" + port + ".json"
try:
    state = json.load(open(path))
except FileNotFoundError:
    state = {{"trust": "pcp", "pfc": [0] * 8}}
if option("--trust"):
    state["trust"] = option("--trust")
if option("--pfc"):
    state["pfc"] = [int(x) for x in option("--pfc").split(",")]
os.makedirs("{QOS_STATE}", exist_ok=True)
json.dump(state, open(path, "w"))
text = open("/usr/local/lib/gpufleet-lab/mlnx_qos.txt").read()
text = re.sub(r"(?m)^Priority trust state: .*$", "Priority trust state: " + state["trust"], text)
text = re.sub(r"(?m)^(\\s*enabled)(\\s+\\d)+(\\s*)$",
              lambda m: m.group(1) + "".join("   %d" % f for f in state["pfc"]) + m.group(3),
              text)
if state["trust"] != "dscp":
    text = re.sub(r"dscp2prio mapping:\\n(?:\\s+prio:.*\\n)+", "", text)
sys.stdout.write(text)
"""

SWAPOFF = f"""#!/bin/sh
# gpufleet lab stand-in for swapoff NAME: takes it off the node's stand-in /proc/swaps.
f={KERNEL_ROOT}/proc/swaps
grep -q "^$1[[:space:]]" "$f" || {{ echo "swapoff: $1: swapoff failed" >&2; exit 1; }}
awk -v n="$1" 'NR == 1 || $1 != n' "$f" > "$f.new" && mv "$f.new" "$f"
"""


def install(lab: Lab, node: str) -> None:
    """The stand-ins on ``node``, its kernel state seeded now and at every boot."""
    index = lab.node(node).index
    commands = [
        f"mkdir -p {BOOT_HOOKS} /usr/local/lib/gpufleet-lab",
        f"printf '%s' {shlex.quote(SEED)} > {HOOK} && chmod 755 {HOOK}",
        f"printf '%s' {shlex.quote(CX7.read_text())} > /usr/local/lib/gpufleet-lab/mlnx_qos.txt",
        f"printf '%s' {shlex.quote(MLNX_QOS)} > /usr/local/sbin/mlnx_qos",
        f"printf '%s' {shlex.quote(SWAPOFF)} > /usr/local/sbin/swapoff",
        "chmod 755 /usr/local/sbin/mlnx_qos /usr/local/sbin/swapoff",
        "ln -sf /usr/local/sbin/swapoff /usr/sbin/swapoff",
        HOOK,
    ]
    for offset, port in zip((10, 110), PORTS, strict=True):
        commands += [f"{{ ip link show {port} >/dev/null 2>&1 || "
                     f"ip link add {port} type veth peer name {port}-peer; }}",
                     f"ip addr replace {FABRIC_SUBNET}.{offset + index}/24 dev {port}",
                     f"ip link set {port} up"]
    node_sh(lab, node, " && ".join(commands))


def write(lab: Lab, node: str, path: str, text: str) -> None:
    """Set a stand-in kernel file (``path`` as on a real node: /proc/sys/kernel/...)."""
    node_sh(lab, node, f"printf '%s\\n' {shlex.quote(text)} > {KERNEL_ROOT}{path}")


def add_swap(lab: Lab, node: str, name: str = "/swap.img", kib: int = 4009980) -> None:
    """A swap file active on ``node`` as /proc/swaps lists Ubuntu's default one."""
    row = shlex.quote(name.ljust(40) + "file")
    swaps = f"{KERNEL_ROOT}/proc/swaps"
    node_sh(lab, node, f"printf '%s\\t\\t%s\\t\\t0\\t\\t-2\\n' {row} {kib} >> {swaps}")
