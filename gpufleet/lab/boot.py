"""A lab node's boot, as shell run in its new namespaces: the copy-on-write overlays and
private mounts, the first boot's host keys, names, reboot and chronyc stand-ins, the NVIDIA
module's stand-in, the boot hooks tests install (stand-ins of what a kernel sets at boot), and
its sshd."""

from __future__ import annotations

import shlex
import sys

from gpufleet.lab.model import LabConfig, Node

OVERLAID = ("etc", "var", "opt", "usr", "root")
CHRONY_REPORT = "/etc/gpufleet-lab/chronyc-tracking"
CHRONY_TRACKING = """\
Reference ID    : 7F000001 (127.0.0.1)
Stratum         : 9
Ref time (UTC)  : Mon Dec 07 05:16:13 2026
System time     : 0.000002696 seconds fast of NTP time
Last offset     : +0.000000032 seconds
RMS offset      : 0.000000150 seconds
Frequency       : 0.007 ppm slow
Residual freq   : +0.000 ppm
Skew            : 0.095 ppm
Root delay      : 0.000007121 seconds
Root dispersion : 0.000001346 seconds
Update interval : 0.3 seconds
Leap status     : Normal
"""
"""What a node's chronyc stand-in reports at first: chrony 4.3's ``chronyc -n tracking`` of a
clock synchronised to a server (captured on the build machine,
tests/fixtures/published/chronyc-n-tracking-4.3-debian12-loopback-server.txt). Every lab
node runs on the controller's kernel clock, so none can drift from another; a test writes
another real report into the node's CHRONY_REPORT to make its clock look unsynchronised or
far off."""


def boot_script(config: LabConfig, node: Node) -> str:
    """What the node's new namespaces run at boot: its mounts, its first boot, the module
    stand-in, the boot hooks, then its sshd."""
    d = node.dir
    q = shlex.quote
    mounts = [
        f"mount -t overlay overlay -o lowerdir=/{sub},upperdir={q(str(d / 'upper' / sub))},"
        f"workdir={q(str(d / 'work' / sub))} /{sub}"
        for sub in OVERLAID
    ]
    return "\n".join([
        *mounts,
        f"mount --bind {q(str(d / 'tmp'))} /tmp",
        f"mount --bind {q(str(d / 'boot'))} /boot",
        "mount -t sysfs sysfs /sys",
        "mount -t tmpfs -o mode=0755 tmpfs /run",
        "mkdir -p /run/sshd /run/lock",
        "mount -t tmpfs -o mode=1777 tmpfs /dev/shm",
        "mount -t tmpfs -o mode=0555 tmpfs /proc/driver",
        f"cat /proc/sys/kernel/random/uuid > {q(str(d / 'boot_id'))}",
        f"mount --bind {q(str(d / 'boot_id'))} /proc/sys/kernel/random/boot_id",
        f"hostname {q(node.name)}",
        first_boot_script(config, node),
        module_load_script(),
        boot_hooks_script(),
        f"/usr/sbin/sshd -o ListenAddress={q(node.address)}"
        f" -o PidFile={q(str(node.sshd_pidfile))}"
        " -o HostKey=/etc/ssh/ssh_host_ed25519_key -o PasswordAuthentication=no"
        " -o KbdInteractiveAuthentication=no -o PermitRootLogin=prohibit-password"
        " -o UseDNS=no -o MaxStartups=200:30:400 -o MaxSessions=64"
        f" -E {q(str(d / 'sshd.log'))}",
    ])


def first_boot_script(config: LabConfig, node: Node) -> str:
    """Once per node: its host key, names, the controller's key, no apt sources, and the
    reboot stand-in."""
    q = shlex.quote
    pub = q(str(config.key) + ".pub")
    return "\n".join([
        "if [ ! -f /etc/gpufleet-lab/node ]; then",
        "  rm -f /etc/ssh/ssh_host_*",
        "  ssh-keygen -q -t ed25519 -N '' -C '' -f /etc/ssh/ssh_host_ed25519_key",
        f"  echo {q(node.name)} > /etc/hostname",
        f"  printf '127.0.0.1 localhost\\n127.0.1.1 %s\\n' {q(node.name)} > /etc/hosts",
        "  mkdir -p /root/.ssh && chmod 700 /root/.ssh",
        f"  cp {pub} /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys",
        "  rm -f /root/.ssh/known_hosts",
        "  rm -rf /root/.bashrc /root/.profile /root/.bash_profile",
        "  for f in .bashrc .profile; do [ ! -f /etc/skel/$f ] || cp /etc/skel/$f /root/; done",
        "  rm -f /etc/apt/sources.list && rm -rf /etc/apt/sources.list.d/*",
        "  rm -rf /var/lib/apt/lists/* && mkdir -p /var/lib/apt/lists/partial",
        "  mkdir -p /etc/gpufleet-lab /usr/local/sbin",
        f"  echo {q(node.name)} > /etc/gpufleet-lab/node",
        f"  printf '%s\\n' {q(reboot_standin(config, node))} > /usr/local/sbin/reboot",
        "  chmod 755 /usr/local/sbin/reboot",
        "  for cmd in reboot shutdown poweroff halt; do",
        "    ln -sf /usr/local/sbin/reboot /usr/sbin/$cmd",
        "  done",
        f"  printf '%s' {q(CHRONY_TRACKING)} > {CHRONY_REPORT}",
        f"  printf '%s\\n' {q(CHRONYC_STANDIN)} > /usr/local/bin/chronyc",
        "  chmod 755 /usr/local/bin/chronyc",
        "fi",
    ])


CHRONYC_STANDIN = "\n".join([
    "#!/bin/sh",
    "# gpufleet lab stand-in for chronyc: the node's clock is the controller's; tracking",
    f"# replays the chrony report in {CHRONY_REPORT}.",
    'case " $* " in *" tracking "*) exec cat ' + CHRONY_REPORT + ";; esac",
    "echo '506 Cannot talk to daemon'",
    "exit 1",
])


def reboot_standin(config: LabConfig, node: Node) -> str:
    """/usr/local/sbin/reboot on a node: asks the controller's lab to reboot it."""
    cfg = config
    argv = [sys.executable, "-m", "gpufleet.lab", "--name", cfg.name, "--root",
            str(cfg.root), "--subnet", cfg.subnet, "--inventory-dir",
            str(cfg.inventory_dir.resolve()), "reboot-node", node.name]
    return "\n".join([
        "#!/bin/sh",
        "# gpufleet lab stand-in for reboot: the lab stops this node and boots it again.",
        f"setsid nsenter -t \"$(cat {shlex.quote(str(cfg.anchor_pidfile))})\" -m -u -n -i -- "
        + shlex.join(argv)
        + " --delay 1 </dev/null >/dev/null 2>&1 &",
    ])


BOOT_HOOKS = "/etc/gpufleet-lab/boot.d"


def boot_hooks_script() -> str:
    """Stand in for what the kernel and its drivers set at every boot: each executable a test
    put in BOOT_HOOKS runs, in name order (a hook that fails is reported, the boot goes on)."""
    return "\n".join([
        f"for hook in {BOOT_HOOKS}/*; do",
        '  if [ -x "$hook" ]; then "$hook" || echo "boot hook $hook failed" >&2; fi',
        "done",
    ])


def module_load_script() -> str:
    """Stand in for loading the NVIDIA kernel module at boot: publish, as
    /proc/driver/nvidia/version, the module line of the driver package installed (each
    driver stand-in carries the line its real module prints, open or proprietary)."""
    return "\n".join([
        "line=$(cat /usr/lib/gpufleet-lab/*.nvidia-module 2>/dev/null | head -n1)",
        'if [ -n "$line" ]; then',
        "  mkdir -p /proc/driver/nvidia",
        '  printf "%s\\n" "$line" > /proc/driver/nvidia/version',
        "fi",
    ])
