"""Every fact gpufleet gathers: a shell snippet and a pure parser of what it prints.

A snippet that needs a tool checks for it and exits 127 with a reason, which
becomes an absent fact; it never fails the gathering of the others. A fact whose tool
can hang names it as its ``guard``: it then runs under the per-snippet deadline.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.facts import formats, gpu_state
from gpufleet.facts.parsers import (
    cuda,
    firmware,
    gpudirect,
    network,
    nvidia_smi,
    packages,
    system,
    watch,
)


@dataclass(frozen=True)
class Fact:
    """One fact: the shell that produces it, the parser of its output, and the tool that
    may hang (the snippet then runs under its own deadline)."""

    name: str
    shell: str
    parse: Callable[[str], Any]
    guard: str | None = None


SYSTEMD_RUNS = "[ -d /run/systemd/system ]"
"""Shell test: systemd is the init system of the host (what sd_booted(3) checks)."""
NO_SYSTEMD = f"{SYSTEMD_RUNS} || {{ echo 'no systemd on this host'; exit 127; }}; "
"""Snippet prefix: the fact is absent, saying why, on a host without systemd."""


def _yes(text: str) -> bool:
    return text.strip() == "yes"


def needs(tool: str, reason: str) -> str:
    """Snippet prefix: exit 127 with ``reason`` when ``tool`` is missing."""
    return f"command -v {tool} >/dev/null 2>&1 || {{ echo {shlex.quote(reason)}; exit 127; }}; "


def rdma_fact(root: str = "/sys", name: str = "rdma") -> Fact:
    """Every port under ``<root>/class/infiniband``: one tab-separated line each (device,
    port, link layer, state, physical state, rate, the partition keys at indexes 0 and 1
    (a tenant's key may be either: Azure's HPC images), the device's netdevs), read with
    the shell's own ``read`` and ``printf`` (no process per file: the cost stays flat with
    twelve ports). ``root`` other than ``/sys`` reads a stand-in tree."""
    base = shlex.quote(f"{root.rstrip('/')}/class/infiniband")
    return Fact(name, "\n".join([
        f"for d in {base}/*; do [ -d \"$d\" ] || continue",
        '  n=; for x in "$d"/device/net/*; do [ -e "$x" ] && n="${n:+$n,}${x##*/}"; done',
        '  for p in "$d"/ports/*; do [ -d "$p" ] || continue',
        "    l=; s=; f=; r=; k=; j=",
        '    { read -r l < "$p/link_layer"; } 2>/dev/null; '
        '{ read -r s < "$p/state"; } 2>/dev/null',
        '    { read -r f < "$p/phys_state"; } 2>/dev/null; '
        '{ read -r r < "$p/rate"; } 2>/dev/null',
        '    { read -r k < "$p/pkeys/0"; } 2>/dev/null; '
        '{ read -r j < "$p/pkeys/1"; } 2>/dev/null; k="$k${j:+,$j}"',
        "    printf '%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n' \"${d##*/}\" \"${p##*/}\" "
        '"${l:--}" "${s:--}" "${f:--}" "${r:--}" "${k:--}" "${n:--}"',
        "  done",
        "done",
    ]), formats.rdma_devices)


SYSTEMD = Fact("systemd", f"{SYSTEMD_RUNS} && echo yes || echo no", _yes)
"""Whether systemd runs on the host: the one fact every role that manages a unit reads."""

GPU_QUERY = ",".join([
    "index", "name", "uuid", "pci.bus_id", "driver_version", "vbios_version", "memory.total",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current",
    "pcie.link.width.max", "temperature.gpu", "power.draw", "power.limit", "clocks.sm",
    "clocks.max.sm", "persistence_mode", "clocks_event_reasons.active",
    "clocks_event_reasons.hw_slowdown", "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.hw_power_brake_slowdown", "clocks_event_reasons.sw_thermal_slowdown",
    "clocks_event_reasons.sw_power_cap", "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total",
    "remapped_rows.pending", "remapped_rows.failure", "compute_cap", *gpu_state.QUERY_FIELDS,
])
GPU_QUERY_RETRIES = 8
GPU_QUERY_SHELL = (
    f"q={GPU_QUERY}; n=0; "
    "while :; do out=$(nvidia-smi --query-gpu=$q --format=csv,nounits 2>&1) && break; rc=$?; "
    "f=$(printf '%s\\n' \"$out\" | sed -n 's/^Field \"\\(.*\\)\" is not a valid field to "
    "query\\.$/\\1/p' | head -n 1); k=; IFS=,; for x in $q; do [ \"$x\" = \"$f\" ] || "
    "k=\"$k${k:+,}$x\"; done; unset IFS; "
    f"if [ -z \"$f\" ] || [ \"$k\" = \"$q\" ] || [ $n -ge {GPU_QUERY_RETRIES} ]; then "
    "printf '%s\\n' \"$out\"; exit $rc; fi; q=$k; n=$((n+1)); done; printf '%s\\n' \"$out\"")
"""The GPU query, once; a driver that does not know a field (an older one) names it, and the
query runs again without it, so that field alone is missing from the rows (at most
GPU_QUERY_RETRIES fields dropped)."""
NFT_DIGEST = "nft list table inet gpufleet | sha256sum | cut -c1-64"
IPTABLES_DIGEST = ("iptables-save -t filter | grep -E 'GPUFLEET-INPUT' | "
                   "sed 's/\\[[0-9]*:[0-9]*\\]//' | sha256sum | cut -c1-64")
NO_SMI = "nvidia-smi not found (no NVIDIA driver user space on this host)"

TORCH_PROBE = (
    "import json, sys\n"
    "info = {'python': sys.version.split()[0]}\n"
    "import torch\n"
    "info['torch'] = torch.__version__\n"
    "info['cuda'] = torch.version.cuda\n"
    "try:\n"
    "    info['nccl'] = '.'.join(map(str, torch.cuda.nccl.version()))\n"
    "except Exception:\n"
    "    info['nccl'] = None\n"
    "info['device_count'] = torch.cuda.device_count()\n"
    "flags = getattr(torch._C, '_cuda_getArchFlags', None)\n"
    "info['arch_list'] = (flags() or '').split() if flags else []\n"
    "import torch.distributed as dist\n"
    "info['gloo'] = dist.is_gloo_available()\n"
    "info['nccl_available'] = dist.is_nccl_available()\n"
    "print(json.dumps(info))\n"
)


TORCH_FACT_PROBE = (
    "import importlib.metadata as md, importlib.util, json, os, sys\n"
    "spec = importlib.util.find_spec('torch')\n"
    "if spec is None or not spec.origin:\n"
    "    sys.exit(\"ModuleNotFoundError: No module named 'torch'\")\n"
    "path = os.path.join(os.path.dirname(spec.origin), 'version.py')\n"
    "ns = {}\n"
    "exec(compile(open(path).read(), path, 'exec'), ns)\n"
    "nccl = sorted(d.version for d in md.distributions()\n"
    "              if (d.metadata['Name'] or '').lower().startswith('nvidia-nccl'))\n"
    "print(json.dumps({'python': sys.version.split()[0], 'torch': ns['__version__'],\n"
    "                  'cuda': ns.get('cuda'), 'nccl': nccl[-1] if nccl else None}))\n"
)
"""What torch reports without importing it (importing takes seconds): torch/version.py
and the version of the nvidia-nccl wheel that torch loads. The full probe above is
what installs and conformance checks use."""


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _int(text: str) -> int:
    return int(text.strip())


def _float(text: str) -> float:
    return float(text.strip())


def _ssh_client(text: str) -> str | None:
    fields = text.split()
    return fields[0] if fields else None


def _headers(text: str) -> bool:
    return text.strip() == "yes"


def _interfaces(text: str) -> list[dict[str, Any]]:
    stripped = text.lstrip()
    if stripped.startswith("["):
        return network.ip_addr_json(text)
    return network.sys_class_net(text)


TIME_SYNC = (
    "if command -v chronyc >/dev/null 2>&1 && out=$(chronyc -n tracking 2>&1); then "
    "echo @chronyc; printf '%s\\n' \"$out\"; exit 0; fi; "
    f"{SYSTEMD_RUNS} && command -v timedatectl >/dev/null 2>&1 || "
    "{ echo \"${out:-no chronyd answers and systemd does not run on this host}\"; exit 127; }; "
    "echo @timedatectl; timedatectl show -p NTPSynchronized -p NTP 2>&1")
"""How the clock is kept: chrony's own report, its offset included, where chronyd answers;
else systemd's synchronised flag (systemd-timesyncd's offset is the clock suite's own fact,
``timesync_status``: one more D-Bus call only where that suite runs). chronyc answers at
once when chronyd is not running (its socket, or localhost's closed UDP port), so a host
without chrony pays one failed command, and one with it no D-Bus call at all."""


BASE_FACTS: list[Fact] = [
    Fact("hostname", "hostname", _first_line),
    Fact("os_release", "cat /etc/os-release", system.os_release),
    Fact("kernel", "uname -r", _first_line),
    Fact("arch", "uname -m", _first_line),
    Fact("cpus", "nproc", _int),
    Fact("meminfo", "cat /proc/meminfo", system.meminfo),
    Fact("boot_id", "cat /proc/sys/kernel/random/boot_id", _first_line),
    Fact("uptime_s", "cut -d' ' -f1 /proc/uptime", _float),
    Fact("clock", "date +%s.%N", _float),
    Fact("ssh_client", "echo \"${SSH_CONNECTION:-}\"", _ssh_client),
    Fact("disk_free", "df -Pk / /var /opt /tmp", formats.disk_free, "df"),
    Fact("time_sync", TIME_SYNC, formats.time_sync, "timedatectl"),
    Fact("kernel_headers", "if [ -d \"/lib/modules/$(uname -r)/build\" ]; then echo yes; "
         "else echo no; fi", _headers),
    Fact("gpus", needs("nvidia-smi", NO_SMI) + GPU_QUERY_SHELL, nvidia_smi.nvidia_smi_query,
         "nvidia-smi"),
    Fact("gpu_list", needs("nvidia-smi", NO_SMI) + "nvidia-smi -L", nvidia_smi.nvidia_smi_list,
         "nvidia-smi"),
    Fact("gpu_topology", needs("nvidia-smi", NO_SMI) + "nvidia-smi topo -m",
         nvidia_smi.nvidia_topo, "nvidia-smi"),
    Fact("nvlink", needs("nvidia-smi", NO_SMI) + "nvidia-smi nvlink --status",
         nvidia_smi.nvlink_status, "nvidia-smi"),
    Fact("gpu_fabric", needs("nvidia-smi", NO_SMI) + "nvidia-smi -q | awk " + shlex.quote(
        "/^GPU /{print} /^    Persistence Mode/{print} /^    [A-Za-z]/{f=($0 ~ /^    Fabric/)} "
        "/^    Fabric/{print} f && /^        (State|Status) /{print}"), nvidia_smi.nvidia_smi_q,
         "nvidia-smi"),
    Fact("nvidia_module", "if [ -r /proc/driver/nvidia/version ]; then "
         "cat /proc/driver/nvidia/version; else echo 'no NVIDIA kernel module loaded'; "
         "exit 127; fi", system.proc_driver_version),
    Fact("pci_gpus", "for d in /sys/bus/pci/devices/*; do "
         "[ \"$(cat \"$d/vendor\" 2>/dev/null)\" = 0x10de ] || continue; "
         "echo \"${d##*/} $(cat \"$d/class\") $(cat \"$d/device\") "
         "$(cat \"$d/current_link_speed\" 2>/dev/null) x$(cat \"$d/current_link_width\" "
         "2>/dev/null) numa=$(cat \"$d/numa_node\" 2>/dev/null)\"; done",
         system.sys_pci_gpus),
    Fact("cuda_version_json", "if [ -r /usr/local/cuda/version.json ]; then "
         "cat /usr/local/cuda/version.json; else echo 'no /usr/local/cuda/version.json'; "
         "exit 127; fi", cuda.cuda_version_json),
    Fact("nvcc", "n=/usr/local/cuda/bin/nvcc; [ -x \"$n\" ] || n=$(command -v nvcc) || "
         "{ echo 'nvcc not found'; exit 127; }; \"$n\" --version", cuda.nvcc_version),
    Fact("interfaces", "if command -v ip >/dev/null 2>&1; then ip -j addr; else "
         "for i in /sys/class/net/*; do echo \"${i##*/} $(cat \"$i/mtu\") "
         "$(cat \"$i/operstate\") $(cat \"$i/address\")\"; done; fi", _interfaces),
    Fact("port_range", "cat /proc/sys/net/ipv4/ip_local_port_range", network.port_range),
    Fact("firewall",
         "if command -v nft >/dev/null 2>&1; then "
         "echo \"nft $(nft list tables 2>/dev/null | awk '{print $2\":\"$3}' | paste -sd, -)\"; "
         "if nft list table inet gpufleet >/dev/null 2>&1; then "
         f"echo \"nft_gpufleet $({NFT_DIGEST})\"; "
         "else echo 'nft_gpufleet absent'; fi; else echo 'nft absent'; fi; "
         "if command -v iptables-save >/dev/null 2>&1; then echo 'iptables present'; "
         f"if iptables -n -L GPUFLEET-INPUT >/dev/null 2>&1; then "
         f"echo \"iptables_gpufleet $({IPTABLES_DIGEST})\"; "
         "else echo 'iptables_gpufleet absent'; fi; else echo 'iptables absent'; fi; "
         "if command -v ufw >/dev/null 2>&1; then "
         "echo \"ufw $(ufw status 2>/dev/null | head -n1 | awk '{print $2}')\"; fi; "
         "if command -v firewall-cmd >/dev/null 2>&1; then "
         "echo \"firewalld $(firewall-cmd --state 2>&1)\"; fi", formats.firewall, "firewall"),
    rdma_fact(),
]


def packages_fact(names: list[str]) -> Fact:
    """dpkg's view of the named packages (version, installed, held)."""
    args = " ".join(shlex.quote(n) for n in sorted(names))
    return Fact("packages", needs("dpkg-query", "no dpkg on this host (not Debian/Ubuntu)")
                + "dpkg-query -W -f='${Package}\\t${Version}\\t${Status}\\n' " + args
                + " 2>/dev/null; true", packages.dpkg_query)


def file_fact(path: str) -> Fact:
    """A file's existence, mode, owner and exact bytes."""
    p = shlex.quote(path)
    return Fact(f"file:{path}", f"if [ -f {p} ]; then echo \"present $(stat -c '%a %U:%G' {p})\"; "
                f"base64 < {p}; else echo missing; fi",
                lambda text: formats.file_state(path, text))


@functools.cache
def file_digest_fact(path: str) -> Fact:
    """A file's existence, mode, owner, size and SHA-256, without its bytes: for a file
    whose content is the same on many hosts and may be large (the cluster's address
    sets), so a host's facts do not grow with the fleet. One Fact per path (requests that
    name it twice gather it once)."""
    p = shlex.quote(path)
    return Fact(f"file_digest:{path}",
                f"if [ -f {p} ]; then echo \"present $(stat -c '%a %U:%G %s' {p}) "
                f"$(sha256sum < {p} | cut -c1-64)\"; else echo missing; fi",
                lambda text: formats.file_digest(path, text))


def link_fact(path: str) -> Fact:
    """A symbolic link's literal target."""
    p = shlex.quote(path)
    return Fact(f"link:{path}", f"if [ -L {p} ]; then echo \"-> $(readlink {p})\"; "
                f"elif [ -e {p} ]; then echo notlink; else echo missing; fi", formats.link_target)


def torch_fact(python: str) -> Fact:
    """What torch reports under the given interpreter (version, CUDA, bundled NCCL).

    In a virtual environment the files are read directly (pyvenv.cfg, torch/version.py,
    the nvidia-nccl wheel's dist-info name): starting Python would cost a node tens of
    milliseconds. Elsewhere the interpreter runs TORCH_FACT_PROBE.
    """
    p = shlex.quote(python)
    return Fact(f"torch:{python}", "\n".join([
        f"py=$(command -v {p}) || {{ echo 'no python at '{p}; exit 127; }}",
        'root=$(dirname "$(dirname "$py")")',
        'vf=$(ls "$root"/lib/python*/site-packages/torch/version.py 2>/dev/null | head -n1)',
        'if [ -f "$root/pyvenv.cfg" ] && [ -n "$vf" ]; then',
        '  echo "@venv $(sed -n \'s/^version *= *//p\' "$root/pyvenv.cfg" | head -n1)"',
        '  echo "@nccl $(ls -d "${vf%/torch/version.py}"/nvidia_nccl*.dist-info 2>/dev/null '
        '| head -n1)"',
        '  cat "$vf"',
        "else",
        f'  "$py" -c {shlex.quote(TORCH_FACT_PROBE)}',
        "fi",
    ]), formats.torch_files, "python")


def sysctl_fact(key: str) -> Fact:
    """A sysctl's current value, read from /proc/sys (sysctl's convention: a '/' in the key
    stands for a '.' inside a name, e.g. the VLAN interface eth0.100)."""
    path = "/proc/sys/" + key.translate(str.maketrans("./", "/."))
    return Fact(f"sysctl:{key}", f"cat {shlex.quote(path)}", network.sysctl_value)


def _under(root: str, path: str) -> str:
    """``path`` under ``root`` (``""`` on a node), quoted for the shell."""
    return shlex.quote(root + path)


READ_LINES = ('n=0; for f; do [ -r "$f" ] || continue; while IFS= read -r l || [ -n "$l" ]; '
              'do printf \'%s:%s\\n\' "$f" "$l"; n=1; done 2>/dev/null <"$f"; done')
"""Shell: each line of each readable file of ``"$@"`` as ``PATH:LINE``, the form ``grep -s -H
''`` prints, with shell builtins alone (no process started on a node); ``n`` is 1 when a line
was printed."""


@functools.cache
def hca_firmware_fact(root: str = "") -> Fact:
    """Each RDMA device's firmware version, board id and HCA type (sysfs reads under
    ``root``); absent, saying so, on a host without RDMA devices."""
    base = _under(root, "/sys/class/infiniband")
    return Fact("hca_firmware", f"set -- {base}/*; [ -e \"$1\" ] || "
                "{ echo 'no RDMA devices (nothing in /sys/class/infiniband)'; exit 127; }; "
                f"set -- {base}/*/fw_ver {base}/*/board_id {base}/*/hca_type; {READ_LINES}",
                lambda text: firmware.hca_firmware(text, root))


@functools.cache
def bios_fact(root: str = "") -> Fact:
    """The BIOS vendor, version and date and the board's names from the DMI table (sysfs
    reads under ``root``); absent, saying why, where the kernel shows no DMI table (a VM
    without SMBIOS, an ARM board without it) or none of its files is readable."""
    base = _under(root, "/sys/class/dmi/id")
    files = " ".join(f"{base}/{name}" for name in firmware.DMI_FILES)
    return Fact("bios", f"[ -d {base} ] || {{ echo 'no DMI table (no /sys/class/dmi/id: "
                "a VM or board without SMBIOS)'; exit 127; }; "
                f"set -- {files}; {READ_LINES}; [ \"$n\" = 1 ] || "
                "{ echo 'the DMI table is not readable'; exit 127; }",
                lambda text: firmware.dmi_bios(text, root))


@functools.cache
def gsp_firmware_fact(root: str = "") -> Fact:
    """Each GPU's GSP firmware from the NVIDIA driver's per-GPU information file (procfs
    reads under ``root``, no nvidia-smi run); absent, saying so, where no NVIDIA kernel
    module serves a GPU."""
    base = _under(root, "/proc/driver/nvidia/gpus")
    return Fact("gsp_firmware", f"set -- {base}/*/information; [ -e \"$1\" ] || "
                "{ echo 'no NVIDIA GPU in /proc/driver/nvidia/gpus (no NVIDIA kernel module "
                f"loaded)'; exit 127; }}; {READ_LINES}",
                lambda text: firmware.gsp_firmware(text, root))


WATCH = "watch"
WATCH_REPORT = "watch-report.json"


@functools.cache
def watch_fact(state_dir: str) -> Fact:
    """The standing watch's last report, ``STATE_DIR/watch-report.json``, read whole up to
    ``watch.REPORT_LIMIT`` bytes and parsed on the controller. A missing report (the watch
    has not run yet), one that is not a regular file (a FIFO would block the read) or a
    larger one is not read, saying why. One Fact per directory (requests that name it twice
    gather it once)."""
    path = shlex.quote(f"{state_dir.rstrip('/')}/{WATCH_REPORT}")
    limit = watch.REPORT_LIMIT
    return Fact(WATCH, "\n".join([
        f"f={path}",
        '[ -e "$f" ] || { echo "no watch report at $f (the watch has not run yet)"; exit 127; }',
        '[ -f "$f" ] || { echo "$f is not a regular file: not read"; exit 1; }',
        'n=$(wc -c < "$f") || exit 1',
        f'[ "$n" -le {limit} ] || '
        f'{{ echo "$f is $n bytes, more than {limit}: not read"; exit 1; }}',
        f'head -c {limit} "$f"',
    ]), watch.watch_report)


GPUDIRECT = "gpudirect"


@functools.cache
def gpudirect_fact(root: str) -> Fact:
    """What GPUDirect RDMA needs (``parsers.gpudirect``): the peer-memory module loaded and
    in the running kernel's modules.dep, the NVIDIA module's flavor, the kernel's dma-buf
    config, the RDMA devices and the GPUDirect settings of /etc/nccl.conf, all under ``root``
    (``""`` on a node, the lab's stand-in tree there). File reads and bounded greps; no
    tool that can hang."""
    r = shlex.quote(root.rstrip("/"))
    settings = "|".join(gpudirect.GDR_SETTINGS)
    return Fact(GPUDIRECT, "\n".join([
        f"r={r}",
        'k=$(cat "$r/proc/sys/kernel/osrelease" 2>/dev/null) || k=$(uname -r)',
        'echo "kernel $k"',
        'for m in nvidia_peermem nvidia; do [ -d "$r/sys/module/$m" ] && v=yes || v=no; '
        'echo "${m#nvidia_}_loaded $v"; done',
        'echo "peermem_file $(grep -s -m1 -o -E \'^[^:]*nvidia[-_]peermem[.]ko[^:]*\' '
        '"$r/lib/modules/$k/modules.dep")"',
        'echo "module $(head -n1 "$r/proc/driver/nvidia/version" 2>/dev/null)"',
        'echo "taint $(cat "$r/sys/module/nvidia/taint" 2>/dev/null)"',
        'echo "rdma $(ls "$r/sys/class/infiniband" 2>/dev/null | head -n64 | paste -sd, -)"',
        'echo "dma_buf $(grep -s -m1 -E '
        '\'^(CONFIG_DMA_SHARED_BUFFER=|# CONFIG_DMA_SHARED_BUFFER )\' "$r/boot/config-$k")"',
        f"grep -s -m16 -E '^[[:space:]]*({settings})[[:space:]]*=' \"$r/etc/nccl.conf\" "
        "| sed 's/^/nccl_conf /'",
        "exit 0",
    ]), gpudirect.gpudirect_state)


def gpudirect_log_fact(path: str) -> Fact:
    """The GPUDirect lines of an NCCL INFO log on the node (``gpudirect_nccl_log``: a job's
    ``NCCL_DEBUG_FILE``): channels over the network, the GPU Direct RDMA and DMA-BUF lines,
    the settings NCCL read and each rank's ``comm .. rank`` line; at most 4000 lines of 400
    characters. Absent, saying so, when the file is missing."""
    quoted = shlex.quote(path)
    return Fact(f"gpudirect_log:{path}", "\n".join([
        f"[ -r {quoted} ] || {{ echo 'no NCCL log at '{quoted}; exit 127; }}",
        "grep -a -m4000 -E 'via NET/|GPU Direct RDMA|DMA-BUF|_GDR_|NCCL_DMABUF|NCCL version"
        f"|NCCL INFO comm 0x' {quoted} | cut -c1-400",
        "exit 0",
    ]), gpudirect.log_lines)


def json_safe(value: Any) -> Any:
    """Facts as JSON-compatible data (bytes become text)."""
    return json.loads(json.dumps(value, default=_default))


def _default(obj: Any) -> Any:
    if isinstance(obj, formats.FileState):
        return {"path": obj.path, "exists": obj.exists, "mode": obj.mode, "owner": obj.owner,
                "bytes": len(obj.content)}
    if isinstance(obj, formats.FileDigest):
        return {"path": obj.path, "exists": obj.exists, "mode": obj.mode, "owner": obj.owner,
                "bytes": obj.size, "sha256": obj.sha256}
    if isinstance(obj, (set, frozenset, tuple)):
        return sorted(obj) if isinstance(obj, (set, frozenset)) else list(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # a role's own fact
        return dataclasses.asdict(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
