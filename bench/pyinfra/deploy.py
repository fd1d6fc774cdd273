"""The pyinfra equivalent of gpufleet's roles on the lab's pinned stack: ``pyinfra --dry`` is
the drift check, ``pyinfra`` provisions to the end state gpufleet converges to.

What it manages comes from gpufleet's own plan of the host (bench/desired.py): the same
bytes, versions and commands. On a converged fleet every operation is a no-op; any
operation that would change something is drift.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

from paramiko import SSHException
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.server import Command
from pyinfra.operations import apt, files, server

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"

desired = json.loads((Path(host.data.desired_dir) / host.name / "manifest.json").read_text())


def fact(command: str) -> str:
    """The output of a command that always succeeds (one round trip)."""
    return host.get_fact(Command, f"{{ {command}; }} 2>/dev/null || true") or ""


@operation(is_idempotent=False)
def reboot_into_driver(command: str, timeout_s: int = 900) -> Generator[Any, None, None]:
    """Reboot with gpufleet's command line and wait until the host answers with another
    boot id (the lab's nodes share the controller's uptime, which server.reboot reads)."""
    before = fact(BOOT_ID)
    yield StringCommand(command)

    def wait(state: Any, host: Any) -> None:
        deadline = time.monotonic() + timeout_s
        time.sleep(2)
        host.disconnect()
        while time.monotonic() < deadline:
            host.connect(show_errors=False)
            if host.connected:
                try:
                    ok, output = host.run_shell_command(BOOT_ID)
                except (OSError, EOFError, SSHException):  # the old sshd going down
                    ok = False
                if ok and output.stdout.strip() not in ("", before):
                    return
                host.disconnect()
            time.sleep(1)
        raise TimeoutError(f"{host.name} did not come back within {timeout_s}s")

    yield FunctionCommand(wait, (), {})


# nvidia_repo, driver, cuda, nccl, nccl_env, firewall: every managed file, byte for byte,
# with mode and owner (repository keyring, sources and pin, the apt pins, the
# unattended-upgrades blacklist, NCCL's files, the sysctl.d file, the ruleset, the cluster's
# address sets, the ruleset's unit)
put = {f["path"]: files.put(name=f"File {f['path']}", src=f["src"], dest=f["path"],
                            mode=f["mode"][1:], user=f["owner"], group=f["group"])
       for f in desired["files"]}
planned = list(put.values())

# driver, cuda, nccl: exact versions, held
names = " ".join(shlex.quote(n) for n in desired["packages"])
dpkg: dict[str, tuple[str, str, str]] = {}  # name -> (version, selection, state)
for line in fact(f"dpkg-query -W -f='${{Package}} ${{Version}} ${{Status}}\\n' {names}"
                 ).splitlines():
    parts = line.split()
    if len(parts) == 5:
        dpkg[parts[0]] = (parts[1], parts[2], parts[4])
installed = {n for n, v in desired["packages"].items()
             if dpkg.get(n, ("", "", ""))[::2] == (v, "installed")}
planned.append(apt.packages(name="Packages at their pinned versions",
                            packages=desired["package_specs"],
                            update=len(installed) < len(desired["packages"]),
                            allow_downgrades=True,
                            extra_install_args="--allow-change-held-packages"))
for name in desired["packages"]:
    if dpkg.get(name, ("", "", ""))[1] != "hold":
        planned.append(server.shell(name=f"Hold {name}",
                                    commands=[f"apt-mark hold {shlex.quote(name)}"]))

for path, target in desired["links"].items():
    planned.append(files.link(name=f"Link {path}", path=path, target=target))

# pytorch: the venv, and torch at its version and build (gpufleet's probe, no import)
torch = desired["torch"]
info = json.loads(fact(torch["check"]) or "{}")
if desired["venv"] and info.get("venv") is False:
    server.shell(name=f"Create venv {desired['venv']['path']}",
                 commands=[desired["venv"]["create"]])
reported = str(info.get("torch", ""))
version_ok = reported == torch["version"] if "+" in torch["version"] else \
    reported.split("+", maxsplit=1)[0] == torch["version"]
if not version_ok or (torch["cuda_is_checked"] and info.get("cuda") != torch["cuda"]) or (
        torch["nccl"] and info.get("nccl") != torch["nccl"]):
    server.shell(name=f"Install torch=={torch['version']}",
                 commands=[torch["reinstall" if version_ok else "install"]])

# nccl_env: the live local port range
for key, value in desired["sysctls"].items():
    server.sysctl(name=f"sysctl {key}", key=key, value=value.split())

# firewall: the cluster's address sets, loaded when their file changes under a loaded
# ruleset; the live ruleset is the one recorded at its load; no rules of the other backend
sets = desired["firewall_sets"]
if sets is not None and put[sets["path"]].will_change:
    server.shell(name="Load the cluster's address sets", commands=[sets["load"]])
fw = desired["firewall"]
live = fact(fw["check"]).splitlines()
if "loaded" not in live:
    server.shell(name=f"Load the {fw['backend']} ruleset", commands=[fw["load"]])
for i, stale in enumerate(desired["firewall_stale"]):
    if f"stale {i}" in live:
        server.shell(name=f"Remove the {stale['backend']} rules (previous backend)",
                     commands=[stale["remove"]])

# cuda: nvcc of the release, which gpufleet verifies (and cannot fix) once the role's
# packages, pin and link are in place: here once no file, package or link changes
if not any(op.will_change for op in planned):
    failed = fact(desired["checks_script"]).strip()
    if failed:
        server.shell(name=f"Verify: {failed}",
                     commands=[f"echo {shlex.quote(failed)} >&2; exit 1"])

# driver: the loaded kernel module is the installed driver's (a reboot loads it)
module = desired["nvidia_module"]
loaded = fact("cat /proc/driver/nvidia/version")
if module["version"] not in loaded.split() or \
        ("Open Kernel Module" in loaded) != (module["flavor"] == "open"):
    reboot_into_driver(name="Reboot into the installed NVIDIA driver",
                       command=module["reboot"])
