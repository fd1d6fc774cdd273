"""Render gpufleet's desired state of every host to files, for the equivalent Ansible playbook
and pyinfra deploy.

The roles' own ``plan`` runs against facts that say "nothing is there" (and that the other
firewall backend's rules are, so that their removal is planned too). Every change it
returns becomes what the other tools manage, with the values and commands gpufleet would
use: a file with its exact bytes, mode and owner; a package at its exact version, held; a
link; a live sysctl; the venv and torch (pip's command line); the firewall ruleset, loaded
and recorded in gpufleet's state file; the cluster's address sets file, which the ruleset
includes and which is loaded on its own when it changes under a loaded ruleset; the reboot
into the installed driver. What the roles verify on a converged host without changing it
(nvcc of the CUDA release) is added as a check. A change of any other kind stops the
rendering (:class:`DesiredError`): the other tools would then manage less than gpufleet
does, and the bench would compare unequal work.

Output, per host: ``<out>/<host>/files/<path>`` and ``<out>/<host>/manifest.json``.
"""

from __future__ import annotations

import json
import shlex
import shutil
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import BenchError

from gpufleet import roles as role_registry
from gpufleet.facts.catalog import NFT_DIGEST, TORCH_FACT_PROBE
from gpufleet.facts.formats import FileState, file_digest
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host, Inventory
from gpufleet.provision.apt import AptInstall
from gpufleet.provision.engine import active_roles, fact_request, plan_host
from gpufleet.provision.plan import Change, Put, Run
from gpufleet.provision.reboot import Reboot
from gpufleet.provision.role import RoleVars
from gpufleet.roles.cuda import NVCC_OF_RELEASE, CudaRole
from gpufleet.roles.driver import DriverRole
from gpufleet.roles.firewall import (
    CLUSTER_FILE,
    CLUSTER_SETS,
    STATE_FILE,
    Backend,
    GuardedLoad,
    SetLoad,
)
from gpufleet.roles.pytorch import CPU_BUILD, PipInstall

# How the catalog's firewall fact tells that a backend's rules are loaded.
PRESENT = {"nftables": "nft list table inet gpufleet >/dev/null 2>&1",
           "iptables": "iptables -n -L GPUFLEET-INPUT >/dev/null 2>&1"}
VERSION_JSON = "/usr/local/cuda/version.json"
NVCC = "n=/usr/local/cuda/bin/nvcc; [ -x \"$n\" ] || n=$(command -v nvcc) || exit 1; "


class DesiredError(BenchError):
    """A planned change the Ansible playbook and the pyinfra deploy cannot express."""


def blank_facts(host: Host, request: FactRequest, controller: str) -> Facts:
    """Facts of a host on which nothing gpufleet manages exists yet, but gpufleet's rules
    of both firewall backends are loaded (whichever is not in use is to be removed)."""
    facts = Facts(host.name)
    facts.values["packages"] = {}
    facts.values["ssh_client"] = controller
    facts.values["firewall"] = {"nft_gpufleet_digest": "stale",
                                "iptables_gpufleet_digest": "stale"}
    for path in request.files:
        facts.values[f"file:{path}"] = FileState(path, False)
    for name in (f.name for f in request.custom):
        if name.startswith("file_digest:"):
            path = name.removeprefix("file_digest:")
            facts.values[name] = file_digest(path, "missing")
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
    plan = plan_host(inventory, host, pairs, blank_facts(host, fact_request(pairs), controller))
    manifest: dict[str, Any] = {"host": host.name, "address": host.address, "files": [],
                                "packages": {}, "links": {}, "sysctls": {}, "venv": None,
                                "torch": None, "firewall": None, "firewall_stale": [],
                                "firewall_sets": None,
                                "nvidia_module": None, "checks": []}
    for change in plan.changes:
        for step in change.steps:
            _add(manifest, out, change, step)
    for role, v in pairs:
        if isinstance(role, CudaRole) and v.string("cuda_install") == "apt":
            manifest["checks"] += _cuda_checks(v)
        if isinstance(role, DriverRole) and manifest["nvidia_module"] is not None:
            manifest["nvidia_module"].update(version=v.string("nvidia_driver_version"),
                                             flavor=role.flavor(v))
    if manifest["firewall"] is not None:
        manifest["firewall"]["check"] += "".join(
            f"; if {PRESENT[stale['backend']]}; then echo stale {i}; fi"
            for i, stale in enumerate(manifest["firewall_stale"]))
    if manifest["torch"] is not None:
        manifest["torch"]["check"] = _torch_check(manifest["torch"]["python"])
    manifest["package_specs"] = [f"{n}={v}" for n, v in manifest["packages"].items()]
    manifest["sysctl_paths"] = {k: "/proc/sys/" + k.replace(".", "/")
                                for k in manifest["sysctls"]}
    manifest["checks_script"] = checks_script(manifest["checks"])
    return manifest


def _add(manifest: dict[str, Any], out: Path, change: Change, step: object) -> None:
    """Record what one step of a planned change leaves on the host."""
    kind, _, name = change.resource.partition(" ")
    if isinstance(step, Put):
        manifest["files"].append(_write(out, step.path, step.content, step.mode, step.owner))
    elif isinstance(step, AptInstall) and step.hold:
        for package, version in step.packages.items():
            if "*" in version:
                raise DesiredError(f"{change.item}: {package}={version} is a pattern; the "
                                   "bench needs exact versions (apt resolves patterns on "
                                   "the host)")
            manifest["packages"][package] = version
    elif isinstance(step, Run) and kind == "link":
        manifest["links"][name] = change.after
    elif isinstance(step, Run) and kind == "sysctl":
        manifest["sysctls"][name] = change.after
    elif isinstance(step, Run) and kind == "venv":
        manifest["venv"] = {"path": name, "create": step.command}
    elif isinstance(step, Run) and change.resource.endswith("rules (previous backend)"):
        manifest["firewall_stale"].append({"backend": kind, "remove": step.command})
    elif isinstance(step, PipInstall):
        manifest["torch"] = {"python": step.python, "version": step.version,
                             "cuda_is_checked": step.cuda is not None,
                             "cuda": None if step.cuda is None or step.cuda.lower() in CPU_BUILD
                             else step.cuda, "nccl": step.nccl, "install": _pip(change, step),
                             "reinstall": _pip(change, replace(
                                 step, args=[*step.args[:-1], "--force-reinstall",
                                             step.args[-1]]))}
    elif isinstance(step, GuardedLoad | SetLoad):
        _add_firewall(manifest, out, step)
    elif isinstance(step, Reboot):
        manifest["nvidia_module"] = {"reboot": f"({step.command}) >/dev/null 2>&1 &"}
    else:
        raise DesiredError(f"{change.item} ({change.action}, step {type(step).__name__}): "
                           "bench/desired.py cannot express it for Ansible and pyinfra")


def _add_firewall(manifest: dict[str, Any], out: Path, step: GuardedLoad | SetLoad) -> None:
    """The ruleset file and its load, or the cluster's address sets file and its load."""
    if isinstance(step, GuardedLoad):
        manifest["files"].append(_write(out, step.backend.path, step.content, 0o600,
                                        "root:root"))
        manifest["firewall"] = _firewall(step.backend)
    else:
        manifest["files"].append(_write(out, CLUSTER_FILE, step.content, 0o600, "root:root"))
        manifest["firewall_sets"] = _sets()


def _pip(change: Change, step: PipInstall) -> str:
    """pip's command line (the role's own), which must read nothing from stdin."""
    command, stdin = step.command()
    if stdin:
        raise DesiredError(f"{change.item}: pip reads its package sources from stdin; the "
                           "bench's tools pass none")
    return command


def _firewall(backend: Backend) -> dict[str, str]:
    """The live ruleset's check (``loaded`` or ``reload``, then ``stale N`` for each other
    backend's rules present), load and record, as gpufleet's guarded load leaves them."""
    path = shlex.quote(backend.path)
    record = _record(backend.name, backend.digest)
    check = (f"if {PRESENT[backend.name]} && grep -qF \"\\\"live_sha256\\\": "
             f"\\\"$({backend.digest})\\\"\" {STATE_FILE} 2>/dev/null; then echo loaded; "
             "else echo reload; fi")
    return {"backend": backend.name, "path": backend.path, "state_file": STATE_FILE,
            "check": check, "load": f"{backend.load.replace('{staged}', path)} && {record}"}


def _record(backend: str, digest: str) -> str:
    """The state file gpufleet writes after a load: the backend and the live digest."""
    return (f"d=$({digest}) && printf '{{\"backend\": \"%s\", \"live_sha256\": "
            f"\"%s\"}}\\n' {backend} \"$d\" > {STATE_FILE}")


def _sets() -> dict[str, str]:
    """The cluster's address sets file and its load, as gpufleet's set load leaves them
    once the file is in place: loaded (and the live ruleset recorded) when gpufleet's table
    is; without the table, the ruleset's load, which includes the file, follows."""
    record = _record("nftables", NFT_DIGEST)
    path = shlex.quote(CLUSTER_FILE)
    loaded = f"nft list set inet gpufleet {CLUSTER_SETS['ipv4']} >/dev/null 2>&1"
    return {"path": CLUSTER_FILE,
            "load": f"if {loaded}; then nft -c -f {path} && nft -f {path} && {record}; fi"}


def _cuda_checks(v: RoleVars) -> list[dict[str, str]]:
    """nvcc and version.json (where the toolkit has one) must be the release's: the cuda
    role's checks once its packages are in place."""
    release = v.string("cuda_version")
    nvcc = v.opt_string("cuda_nvcc_version") or NVCC_OF_RELEASE.get(release)
    if nvcc is None or release.count(".") != 2:
        raise DesiredError(f"host {v.host.name}: cuda_version {release} needs its nvcc "
                           "version (cuda_nvcc_version) for the bench")
    json_release = (f"import json, sys; sys.exit(json.load(open('{VERSION_JSON}'))['cuda']"
                    f"['version'] != '{release}')")
    return [{"name": f"nvcc {nvcc} of CUDA {release}",
             "test": NVCC + f"\"$n\" --version | grep -q ', V{nvcc}$'",
             "message": f"CUDA {release} wants nvcc {nvcc}"},
            {"name": f"version.json of CUDA {release}",
             "test": f"[ ! -r {VERSION_JSON} ] || python3 -c {shlex.quote(json_release)}",
             "message": f"{VERSION_JSON} does not say CUDA {release}"}]


def _torch_check(python: str) -> str:
    """What torch reports, as JSON (gpufleet's probe); ``{"venv": false}`` without the venv,
    ``{}`` without torch."""
    py = shlex.quote(python)
    return (f"if [ -x {py} ]; then {py} -c {shlex.quote(TORCH_FACT_PROBE)} 2>/dev/null "
            "|| echo '{}'; else echo '{\"venv\": false}'; fi")


def checks_script(checks: list[dict[str, str]]) -> str:
    """One command that prints the message of every check that fails (nothing when all
    pass)."""
    return "; ".join(f"( {c['test']} ) >/dev/null 2>&1 || echo {shlex.quote(c['message'])}"
                     for c in checks) or "true"


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
