"""Render gpufleet's desired state of every host to files, for the equivalent Ansible playbook
and pyinfra deploy.

The roles' own ``plan`` is run against facts that say "nothing is there": every managed
file comes back as a change carrying the exact bytes gpufleet would write, every link,
package, sysctl and the kernel module as a change carrying its desired value. Nothing is
re-implemented, so the other tools check exactly the content gpufleet checks.

Output, per host: ``<out>/<host>/files/<path>`` and ``<out>/<host>/manifest.json``.
"""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path
from typing import Any

from gpufleet import roles as role_registry
from gpufleet.facts.catalog import TORCH_FACT_PROBE
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.inventory.model import Host, Inventory, load_inventory
from gpufleet.provision.engine import active_roles, fact_request, plan_host
from gpufleet.provision.plan import Put
from gpufleet.roles.firewall import STATE_FILE, GuardedLoad
from gpufleet.roles.pytorch import CPU_BUILD, PytorchRole


def blank_facts(host: Host, request: FactRequest, controller: str) -> Facts:
    """Facts of a host on which nothing gpufleet manages exists yet."""
    facts = Facts(host.name)
    facts.values["packages"] = {}
    facts.values["ssh_client"] = controller
    for path in request.files:
        facts.values[f"file:{path}"] = FileState(path, False)
    for path in request.links:
        facts.values[f"link:{path}"] = None
    for key in request.sysctls:
        facts.values[f"sysctl:{key}"] = ""
    for python in request.pythons:
        facts.absent[f"torch:{python}"] = f"no python at {python}"
    facts.absent["nvidia_module"] = "no NVIDIA kernel module loaded"
    return facts


def host_manifest(inventory: Inventory, host: Host, out: Path, controller: str) -> dict[str, Any]:
    """Write one host's desired files under ``out`` and return its manifest."""
    pairs = active_roles(host, role_registry.ALL)
    facts = blank_facts(host, fact_request(pairs), controller)
    plan = plan_host(inventory, host, pairs, facts)
    manifest: dict[str, Any] = {"host": host.name, "address": host.address, "files": [],
                                "packages": {}, "links": {}, "sysctls": {},
                                "nvidia_module": None, "torch": None, "firewall": None}
    for change in plan.changes:
        kind, _, name = change.resource.partition(" ")
        for step in change.steps:
            if isinstance(step, Put):
                manifest["files"].append(_write(out, step.path, step.content, step.mode,
                                                step.owner))
            elif isinstance(step, GuardedLoad):
                manifest["files"].append(_write(out, step.backend.path, step.content, 0o600,
                                                "root:root"))
                manifest["firewall"] = {"state_file": STATE_FILE, "path": step.backend.path,
                                        "digest": step.backend.digest}
        if kind == "package":
            manifest["packages"][name] = change.after
        elif kind == "link":
            manifest["links"][name] = change.after
        elif kind == "sysctl":
            manifest["sysctls"][name] = change.after
        elif change.resource == "kernel module nvidia":
            manifest["nvidia_module"] = change.after
    for role, v in pairs:
        if isinstance(role, PytorchRole):
            cuda = v.opt_string("pytorch_cuda")
            manifest["torch"] = {"python": role.venv_python(v),
                                 "version": v.string("pytorch_version"),
                                 "check_cuda": cuda is not None,
                                 "cuda": None if cuda is None or cuda.lower() in CPU_BUILD
                                 else cuda,
                                 "probe": TORCH_FACT_PROBE}
    manifest["package_specs"] = [f"{n}={v}" for n, v in manifest["packages"].items()]
    manifest["sysctl_paths"] = {k: "/proc/sys/" + k.replace(".", "/")
                                for k in manifest["sysctls"]}
    return manifest


def _write(out: Path, path: str, content: bytes, mode: int, owner: str) -> dict[str, str]:
    src = out / "files" / path.lstrip("/")
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(content)
    src.chmod(stat.S_IMODE(mode))
    user, _, group = owner.partition(":")
    return {"path": path, "src": str(src), "mode": f"0{mode:o}", "owner": user,
            "group": group or user}


def render_all(inventory_path: Path, out: Path, controller: str) -> dict[str, dict[str, Any]]:
    """Render every host of the inventory; returns host -> manifest."""
    inventory = load_inventory(inventory_path)
    shutil.rmtree(out, ignore_errors=True)
    manifests = {}
    for host in inventory.select(None):
        host_dir = out / host.name
        host_dir.mkdir(parents=True)
        manifest = host_manifest(inventory, host, host_dir, controller)
        (host_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        manifests[host.name] = manifest
    return manifests


if __name__ == "__main__":
    import sys

    result = render_all(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
    print(json.dumps(next(iter(result.values())), indent=2))
