"""The pyinfra equivalent of `invoke drift` on the lab's pinned stack, run with --dry.

The desired file contents are rendered by gpufleet's own roles (bench/desired.py), so both
tools compare the same bytes. On a converged fleet every operation must be a no-op; any
operation that would change something is drift.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.facts.server import Command
from pyinfra.operations import apt, files, server

desired = json.loads((Path(host.data.desired_dir) / host.name / "manifest.json").read_text())

# driver, cuda, nccl: exact versions, held
apt.packages(name="Packages at their pinned versions", packages=desired["package_specs"])

names = " ".join(shlex.quote(n) for n in desired["packages"])
selections = host.get_fact(Command, f"dpkg-query -W -f='${{Package}} ${{Status}}\\n' {names}")
held = {line.split()[0] for line in selections.splitlines() if " hold " in f" {line} "}
for name in desired["packages"]:
    if name not in held:
        server.shell(name=f"Hold {name}", commands=[f"apt-mark hold {shlex.quote(name)}"])

# apt pins, unattended-upgrades blacklist, NCCL config, sysctl.d file, firewall ruleset and
# unit: content, mode and owner
for f in desired["files"]:
    files.put(name=f"File {f['path']}", src=f["src"], dest=f["path"], mode=f["mode"][1:],
              user=f["owner"], group=f["group"])

for path, target in desired["links"].items():
    files.link(name=f"Link {path}", path=path, target=target)

for key, value in desired["sysctls"].items():
    server.sysctl(name=f"sysctl {key}", key=key, value=value.split())

module = host.get_fact(Command, "cat /proc/driver/nvidia/version 2>/dev/null || true")
if desired["nvidia_module"] not in module.split():
    server.shell(name="Reboot into the installed NVIDIA driver", commands=["reboot"])

torch = desired["torch"]
probe = host.get_fact(Command, shlex.join([torch["python"], "-c", torch["probe"]])
                      + " 2>/dev/null || echo '{}'")
info = json.loads(probe or "{}")
if str(info.get("torch", "")).split("+")[0] != torch["version"] or (
        torch["check_cuda"] and info.get("cuda") != torch["cuda"]):
    server.shell(name=f"Install torch=={torch['version']}",
                 commands=[f"{torch['python']} -m pip install torch=={torch['version']}"])

fw = desired["firewall"]
live = host.get_fact(Command, f"live=$({fw['digest']}) && grep -qF "
                     f"\"\\\"live_sha256\\\": \\\"$live\\\"\" {fw['state_file']} "
                     "&& echo same || echo differs")
if live.strip() != "same":
    server.shell(name="Reload the firewall ruleset", commands=[f"nft -f {fw['path']}"])
