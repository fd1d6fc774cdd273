"""NVIDIA Container Toolkit and enroot/pyxis: pinned packages, the engine's runtime read back
from the file nvidia-ctk writes, the CDI spec kept in step with the driver and the GPUs, and
enroot's training settings; the readers on a real CDI spec (tests/fixtures/cdi) and on what
the lab's nvidia-ctk writes."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import VarError
from gpufleet.facts import containers
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import Facts
from gpufleet.facts.parsers import nvidia_smi, system
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.lab.repo import standins
from gpufleet.provision import apt
from gpufleet.provision.plan import Change, Fail, Put, Run
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles import container_toolkit, enroot_pyxis
from gpufleet.roles.container_toolkit_standin import NVIDIA_CTK
from tests.conftest import ROOT

ROLE = container_toolkit.ROLE
REAL_SPEC = ROOT / "tests" / "fixtures" / "cdi" / "nvidia-g4dn-t4-570.133.20.yaml"
H200_LIST = (ROOT / "tests" / "fixtures" / "h200x2" / "query_gpu_csv.txt")
SPEC = "/etc/cdi/nvidia.yaml"
DAEMON = "/etc/docker/daemon.json"
PIN = "/etc/apt/preferences.d/gpufleet-container_toolkit.pref"
PACKAGES = container_toolkit.PACKAGES


def inventory(tmp_path: Path, text: str) -> Inventory:
    body = "all:\n  hosts:\n    gpu01:\n      ansible_host: 10.0.0.11\n" + \
        textwrap.indent(textwrap.dedent(text), " " * 6)
    (tmp_path / "hosts.yml").write_text(body)
    return load_inventory(tmp_path / "hosts.yml")


def plan(inv: Inventory, facts: Facts) -> list[Change]:
    host = inv.hosts["gpu01"]
    v = RoleVars(host, ROLE.defaults)
    ROLE.check(v)
    return ROLE.plan(facts, v, PlanContext(inv, host))


def installed(version: str) -> dict[str, Any]:
    return {"version": version, "status": "hold ok installed", "installed": True, "hold": True}


def present(path: str, text: str) -> FileState:
    return FileState(path, True, text.encode(), "644", "root:root")


def converged_pin() -> FileState:
    return present(PIN, apt.pin_content(ROLE.name, {p: "1.17.8-1" for p in PACKAGES}))


def node(gpus: list[dict[str, Any]], driver: str | None, **files: FileState) -> Facts:
    """A node with the toolkit installed at 1.17.8-1, its GPUs and its loaded driver."""
    values: dict[str, Any] = {
        "packages": {p: installed("1.17.8-1") for p in PACKAGES}, "gpu_list": gpus,
        "systemd": True, f"file:{PIN}": converged_pin(),
        f"file:{SPEC}": FileState(SPEC, False), f"file:{DAEMON}": FileState(DAEMON, False)}
    if driver is not None:
        values["nvidia_module"] = driver
    values.update({f"file:{f.path}": f for f in files.values()})
    return Facts("gpu01", values=values,
                 absent={} if driver else {"nvidia_module": "no NVIDIA kernel module loaded"})


def h200_gpus() -> list[dict[str, Any]]:
    return [{"index": g["index"], "name": g["name"], "uuid": g["uuid"]}
            for g in nvidia_smi.nvidia_smi_query(H200_LIST.read_text())]


def lab_ctk(tmp_path: Path, driver: str, gpus: list[dict[str, Any]]) -> Path:
    """The lab's nvidia-ctk, reading this driver and these GPUs (from fake sources)."""
    (tmp_path / "version").write_text(
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {driver}  Release Build\n")
    listing = "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in gpus)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s' '{listing}'\n")
    smi.chmod(0o755)
    script = tmp_path / "nvidia-ctk"
    script.write_text(NVIDIA_CTK.replace("@VERSION@", "1.17.8")
                      .replace("/proc/driver/nvidia/version", str(tmp_path / "version"))
                      .replace('["nvidia-smi", "-L"]', f'["{smi}", "-L"]'))
    script.chmod(0o755)
    return script


def generated_spec(tmp_path: Path, driver: str, gpus: list[dict[str, Any]]) -> str:
    out = tmp_path / "cdi" / "nvidia.yaml"
    subprocess.run([lab_ctk(tmp_path, driver, gpus), "cdi", "generate", f"--output={out}"],
                   check=True, capture_output=True)
    return out.read_text()


# --------------------------------------------------------------------------- readers


def test_the_driver_and_gpus_of_a_real_cdi_spec() -> None:
    spec = containers.cdi_spec(REAL_SPEC.read_text())
    assert spec == containers.CdiSpec(
        "nvidia.com/gpu", ["0", "GPU-6cf00fa7-59ac-16f2-3e83-d24ccdc56f84", "all"],
        ["GPU-6cf00fa7-59ac-16f2-3e83-d24ccdc56f84"], "570.133.20")


def test_a_spec_without_the_compat_hook_is_read_from_its_libcuda() -> None:
    text = REAL_SPEC.read_text().replace("--host-driver-version=570.133.20", "--other")
    assert containers.cdi_spec(text).driver == "570.133.20"
    no_driver = "\n".join(line for line in text.splitlines() if "libcuda.so.570" not in line)
    assert containers.cdi_spec(no_driver).driver is None


@pytest.mark.parametrize("text", ["- a list\n", "kind: [unclosed\n", "devices: []\n"])
def test_a_file_that_is_not_a_spec_is_refused(text: str) -> None:
    with pytest.raises(containers.ConfigError):
        containers.cdi_spec(text)


def test_the_lab_nvidia_ctk_writes_what_the_real_one_writes(tmp_path: Path) -> None:
    gpus = h200_gpus()
    lab = containers.cdi_spec(generated_spec(tmp_path, "580.95.05", gpus))
    real = containers.cdi_spec(REAL_SPEC.read_text())
    assert lab.kind == real.kind
    assert lab.driver == "580.95.05"
    assert lab.uuids == [g["uuid"] for g in gpus]
    assert lab.devices == [str(g["index"]) for g in gpus] + lab.uuids + ["all"]

    daemon = tmp_path / "daemon.json"
    daemon.write_text('{"log-driver": "journald"}')
    ctk = lab_ctk(tmp_path, "580.95.05", gpus)
    subprocess.run([ctk, "runtime", "configure", "--runtime=docker", f"--config={daemon}",
                    "--set-as-default"], check=True, capture_output=True)
    assert json.loads(daemon.read_text())["log-driver"] == "journald"  # kept
    assert containers.docker_runtime(daemon.read_text()) == containers.EngineRuntime(
        True, "nvidia-container-runtime", True)
    toml = tmp_path / "config.toml"
    toml.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n'
                    'sandbox_image = "registry.k8s.io/pause:3.9"\n')
    subprocess.run([ctk, "runtime", "configure", "--runtime=containerd", f"--config={toml}"],
                   check=True, capture_output=True)
    assert 'sandbox_image = "registry.k8s.io/pause:3.9"' in toml.read_text()
    assert containers.containerd_runtime(toml.read_text()) == containers.EngineRuntime(
        True, "/usr/bin/nvidia-container-runtime", False)


def test_engine_configurations_without_the_runtime() -> None:
    assert containers.docker_runtime("") == containers.EngineRuntime(False, None, False)
    assert containers.docker_runtime('{"runtimes": {}}').present is False
    assert containers.containerd_runtime("version = 3\n").present is False
    v3 = ('[plugins."io.containerd.cri.v1.runtime".containerd]\ndefault_runtime_name = '
          '"nvidia"\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.'
          'options]\nBinaryName = "/usr/bin/nvidia-container-runtime"\n')
    assert containers.containerd_runtime(v3) == containers.EngineRuntime(
        True, "/usr/bin/nvidia-container-runtime", True)
    with pytest.raises(containers.ConfigError, match="not JSON"):
        containers.docker_runtime("{runtimes")
    with pytest.raises(containers.ConfigError, match="not TOML"):
        containers.containerd_runtime("[plugins\n")


ENGINE_CONFIGS = ROOT / "tests" / "fixtures" / "containers"


@pytest.mark.parametrize(("name", "expected"), [
    ("daemon-json-nvidia-docker-1651.json",
     containers.EngineRuntime(True, "/usr/bin/nvidia-container-runtime", True)),
    ("daemon-json-docker-for-linux-1531.json",
     containers.EngineRuntime(True, "nvidia-container-runtime", True)),
])
def test_published_docker_daemon_json(name: str, expected: containers.EngineRuntime) -> None:
    """Two users' daemon.json with the runtime (``runtimeArgs``, a ``data-root`` beside it)."""
    assert containers.docker_runtime((ENGINE_CONFIGS / name).read_text()) == expected


def test_a_published_daemon_json_with_a_trailing_comma_is_refused_by_line() -> None:
    """Hand-written with a comma before the last brace: dockerd refuses to start on it, so
    the reader names the line instead of reading no runtime."""
    text = (ENGINE_CONFIGS / "daemon-json-trailing-comma-getting-started-150.json").read_text()
    with pytest.raises(containers.ConfigError, match=r"not JSON: .*line 9 column 1"):
        containers.docker_runtime(text)


def test_published_containerd_configs() -> None:
    """Version 2 as ``nvidia-ctk runtime configure --set-as-default`` wrote it (plus the
    user's SystemdCgroup); and a microk8s version-1 file whose runtime is named
    ``nvidia-container-runtime``: no runtime named nvidia, so nvidia-ctk is to add one."""
    v2 = (ENGINE_CONFIGS / "containerd-config-v2-nvidia-ctk-nvidia-docker-1788.toml").read_text()
    assert containers.containerd_runtime(v2) == containers.EngineRuntime(
        True, "/usr/bin/nvidia-container-runtime", True)
    v1 = (ENGINE_CONFIGS / "containerd-config-v1-microk8s-k8s-device-plugin-182.toml"
          ).read_text()
    assert containers.containerd_runtime(v1) == containers.EngineRuntime(False, None, False)


# --------------------------------------------------------------------------- the role

DOCKER = 'container_engine: docker\nnvidia_container_toolkit_version: "1.17.8-1"\n'
PODMAN = 'container_engine: podman\nnvidia_container_toolkit_version: "1.17.8-1"\n'


@pytest.mark.parametrize(("text", "message"), [
    ("container_engine: lxc\nnvidia_container_toolkit_version: 1.17.8-1\n",
     "container_engine must be docker or podman or containerd, got 'lxc'"),
    ("container_engine: docker\n", "nvidia_container_toolkit_version must be set"),
    (PODMAN + "nvidia_cdi: false\n", "nvidia_cdi must be true with podman"),
    (PODMAN + "container_engine_config: /etc/containers/containers.conf\n",
     "container_engine_config must be unset with podman"),
    (DOCKER + "nvidia_cdi_spec: 'x; rm -rf /'\n", "nvidia_cdi_spec must be an absolute path"),
    ("container_engine: docker\nnvidia_container_toolkit_version: '1.17 8'\n",
     "which is not a package version"),
])
def test_bad_variables_are_refused_before_any_host(tmp_path: Path, text: str,
                                                   message: str) -> None:
    host = inventory(tmp_path, text).hosts["gpu01"]
    with pytest.raises(VarError, match=message):
        ROLE.check(RoleVars(host, ROLE.defaults))


def test_a_fresh_node_gets_the_four_packages_the_runtime_and_the_spec(tmp_path: Path) -> None:
    facts = node(h200_gpus(), "580.95.05")
    facts.values["packages"] = {}
    changes = plan(inventory(tmp_path, DOCKER), facts)
    assert [(c.item, c.action) for c in changes] == [
        *[(f"container_toolkit/package {p}", "install") for p in PACKAGES],
        ("container_toolkit/runtime docker", "configure"),
        (f"container_toolkit/cdi spec {SPEC}", "generate")]
    runtime, spec = changes[-2:]
    assert [s.describe() for s in runtime.steps] == [
        "nvidia-ctk runtime configure --runtime=docker", "restart docker if it runs"]
    assert isinstance(runtime.steps[0], Run)
    assert runtime.steps[0].command == ("nvidia-ctk runtime configure --runtime=docker "
                                        f"--config={DAEMON}")
    assert (spec.before, spec.after) == ("absent", "driver 580.95.05, 2 GPU(s)")


def test_a_converged_node_has_no_change_and_the_default_runtime_is_checked(
        tmp_path: Path) -> None:
    gpus = h200_gpus()
    spec = present(SPEC, generated_spec(tmp_path, "580.95.05", gpus))
    daemon = present(DAEMON, json.dumps({"runtimes": {"nvidia": {
        "path": "nvidia-container-runtime", "args": []}}}))
    assert plan(inventory(tmp_path, DOCKER), node(gpus, "580.95.05", s=spec, d=daemon)) == []
    [change] = plan(inventory(tmp_path, DOCKER + "container_default_runtime: true\n"),
                    node(gpus, "580.95.05", s=spec, d=daemon))
    assert (change.before, change.after) == (f"{DAEMON}: nvidia runtime (not the default)",
                                             f"{DAEMON}: nvidia runtime (the default)")
    assert change.steps[0].describe() == "nvidia-ctk runtime configure --runtime=docker"
    assert isinstance(change.steps[0], Run) and \
        change.steps[0].command.endswith("--set-as-default")


def test_podman_configures_no_runtime_only_cdi(tmp_path: Path) -> None:
    gpus = h200_gpus()
    spec = present(SPEC, generated_spec(tmp_path, "580.95.05", gpus))
    inv = inventory(tmp_path, PODMAN)
    assert DAEMON not in ROLE.request(RoleVars(inv.hosts["gpu01"], ROLE.defaults)).files
    assert plan(inv, node(gpus, "580.95.05", s=spec)) == []


def test_a_spec_of_the_old_driver_or_missing_a_gpu_is_stale(tmp_path: Path) -> None:
    gpus = h200_gpus()
    old = present(SPEC, generated_spec(tmp_path, "580.95.05", gpus))
    [change] = plan(inventory(tmp_path, PODMAN), node(gpus, "580.105.08", s=old))
    assert (change.item, change.before, change.after) == (
        f"container_toolkit/cdi spec {SPEC}", "driver 580.95.05",
        "driver 580.105.08, 2 GPU(s)")
    [step] = change.steps
    assert isinstance(step, Run)
    assert step.command.startswith(f"nvidia-ctk cdi generate --output={SPEC} ")
    assert "--host-driver-version=580.105.08" in step.command
    assert "libcuda.so.580.105.08" in step.command  # toolkits before 1.17.5 write no hook arg

    # the inventory's pinned driver is what the spec must be of (a driver upgrade regenerates)
    [pinned] = plan(inventory(tmp_path, PODMAN + 'nvidia_driver_version: "580.105.08"\n'),
                    node(gpus, "580.95.05", s=old))
    assert pinned.before == "driver 580.95.05"

    seven = present(SPEC, generated_spec(tmp_path, "580.95.05", gpus[:-1]))
    [missing] = plan(inventory(tmp_path, PODMAN), node(gpus, "580.95.05", s=seven))
    assert missing.before == f"without {gpus[-1]['uuid']}"


def test_an_unreadable_configuration_and_a_node_without_a_driver_fail_clearly(
        tmp_path: Path) -> None:
    broken = present(DAEMON, "{runtimes")
    facts = node([], "580.95.05", d=broken, s=present(SPEC, generated_spec(
        tmp_path, "580.95.05", [])))
    [change] = plan(inventory(tmp_path, DOCKER), facts)
    [step] = change.steps
    assert isinstance(step, Fail) and step.message.startswith(f"{DAEMON} cannot be read (not JSON")
    [spec] = plan(inventory(tmp_path, PODMAN), node([], None))
    [fail] = spec.steps
    assert isinstance(fail, Fail)
    assert fail.message == ("no NVIDIA driver is loaded: the CDI spec cannot be generated "
                            "(no NVIDIA kernel module loaded)")


def test_the_stand_ins_have_nvidias_names_and_dependencies() -> None:
    served = {(p.name, p.version): p for p in standins()}
    for version in ("1.17.8-1", "1.18.0-1"):
        for name in PACKAGES:
            assert (name, version) in served
        assert served[("nvidia-container-toolkit", version)].depends == (
            f"nvidia-container-toolkit-base (= {version}), libnvidia-container-tools "
            f"(= {version}), libnvidia-container-tools (<< 2.0.0)")
        assert "/usr/bin/nvidia-ctk" in served[("nvidia-container-toolkit-base", version)
                                              ].executables


# --------------------------------------------------------------------------- enroot and pyxis

ENROOT = enroot_pyxis.ROLE
ENROOT_VARS = """\
enroot_version: "3.5.0-1"
pyxis_version: "0.20.0-1"
enroot_settings: {ENROOT_ROOTFS_WRITABLE: true, ENROOT_RUNTIME_PATH: "/run/enroot/user-$UID"}
enroot_shm_size: 64g
enroot_rdma: true
shared_mounts: [{path: /datasets, fstype: nfs4}, {path: /checkpoints}]
"""
ENROOT_FILES = ("/etc/enroot/enroot.conf.d/90-gpufleet.conf",
                "/etc/enroot/mounts.d/90-gpufleet.fstab", "/etc/slurm/plugstack.conf")


def enroot_plan(inv: Inventory, facts: Facts) -> list[Change]:
    host = inv.hosts["gpu01"]
    v = RoleVars(host, ENROOT.defaults)
    ENROOT.check(v)
    return ENROOT.plan(facts, v, PlanContext(inv, host))


def enroot_node(plugstack: str | None) -> Facts:
    values: dict[str, Any] = {"packages": {}, "link:/etc/slurm/plugstack.conf.d/pyxis.conf": None,
                              f"file:{apt.pin_path(ENROOT.name)}": FileState("p", False)}
    values.update({f"file:{p}": FileState(p, False) for p in ENROOT_FILES})
    if plugstack is not None:
        values["file:/etc/slurm/plugstack.conf"] = present("/etc/slurm/plugstack.conf",
                                                           plugstack)
    return Facts("gpu01", values=values)


def test_enroot_and_pyxis_are_pinned_and_enroot_gets_the_training_settings(
        tmp_path: Path) -> None:
    inv = inventory(tmp_path, ENROOT_VARS)
    changes = enroot_plan(inv, enroot_node("include /etc/slurm/plugstack.conf.d/*\n"))
    assert [(c.item, c.action) for c in changes] == [
        ("enroot_pyxis/package enroot", "install"), ("enroot_pyxis/package enroot+caps", "install"),
        ("enroot_pyxis/package nvslurm-plugin-pyxis", "install"),
        (f"enroot_pyxis/file {apt.pin_path(ENROOT.name)}", "create"),
        (f"enroot_pyxis/file {ENROOT_FILES[0]}", "create"),
        (f"enroot_pyxis/file {ENROOT_FILES[1]}", "create"),
        ("enroot_pyxis/link /etc/slurm/plugstack.conf.d/pyxis.conf", "link")]
    settings, fstab = (c.steps[0] for c in changes[4:6])
    assert isinstance(settings, Put) and isinstance(fstab, Put)
    assert settings.content.decode().splitlines()[1:] == [
        "ENROOT_ROOTFS_WRITABLE yes", "ENROOT_RUNTIME_PATH /run/enroot/user-$UID"]
    assert fstab.content.decode().splitlines()[1:] == [
        "/datasets /datasets none x-create=dir,bind,rw,nosuid,nodev",
        "/checkpoints /checkpoints none x-create=dir,bind,rw,nosuid,nodev",
        "tmpfs /dev/shm tmpfs x-create=dir,rw,nosuid,nodev,size=64g",
        "/dev/infiniband /dev/infiniband none x-create=dir,bind,rw,nosuid"]
    assert changes[-1].after == "/usr/share/pyxis/pyxis.conf"


@pytest.mark.parametrize("plugstack", [None, "required /usr/lib/other.so\n"])
def test_pyxis_needs_plugstack_conf_to_include_its_directory(tmp_path: Path,
                                                             plugstack: str | None) -> None:
    changes = enroot_plan(inventory(tmp_path, ENROOT_VARS), enroot_node(plugstack))
    [check] = [c for c in changes if c.kind == "plugstack"]
    [fail] = check.steps
    assert isinstance(fail, Fail)
    assert fail.message.startswith("/etc/slurm/plugstack.conf must include "
                                   "/etc/slurm/plugstack.conf.d/* for Slurm to load pyxis")


@pytest.mark.parametrize(("extra", "message"), [
    ("enroot_settings: {PATH: /bin}\n", "enroot_settings PATH: a key ENROOT_"),
    ("enroot_settings: {ENROOT_X: 'a b'}\n", "enroot_settings ENROOT_X"),
    ("enroot_shm_size: lots\n", "enroot_shm_size must be a tmpfs size"),
    ("enroot_mounts: ['data dir']\n", "enroot_mounts must be absolute paths"),
    ("pyxis_plugstack: 'x\\ny'\n", "pyxis_plugstack must be an absolute path"),
])
def test_bad_enroot_variables_are_refused(tmp_path: Path, extra: str, message: str) -> None:
    host = inventory(tmp_path, 'enroot_version: "3.5.0-1"\n' + extra).hosts["gpu01"]
    with pytest.raises(VarError, match=message):
        ENROOT.check(RoleVars(host, ENROOT.defaults))


def test_the_spec_a_real_h200_node_needs(tmp_path: Path) -> None:
    """The real 1x H200 node (tests/fixtures/h200x1: driver 580.159.04, one GPU, no toolkit
    and no spec): the plan generates the spec for its driver and its GPU, and the lab's
    nvidia-ctk, fed the node's real nvidia-smi -L and module line, writes a spec the role
    then finds current."""
    real = ROOT / "tests" / "fixtures" / "h200x1"
    gpus = nvidia_smi.nvidia_smi_list((real / "nvidia_smi_L.txt").read_text())
    driver = system.proc_driver_version((real / "proc_nvidia_version.txt").read_text())
    assert (driver, len(gpus)) == ("580.159.04", 1)
    [change] = plan(inventory(tmp_path, PODMAN), node(gpus, driver))
    assert (change.before, change.after) == ("absent", "driver 580.159.04, 1 GPU(s)")
    spec = present(SPEC, generated_spec(tmp_path, driver, gpus))
    assert plan(inventory(tmp_path, PODMAN), node(gpus, driver, s=spec)) == []
    nodes = (real / "containers" / "dev-nvidia.txt").read_text()
    assert "/dev/nvidia0" in nodes and "/dev/nvidia0" in spec.text


@pytest.mark.parametrize(("hook", "driver", "rc"), [
    (True, "570.133.20", 0), (False, "570.133.20", 0), (False, "580.95.05", 1)])
def test_the_regenerated_spec_is_checked_by_its_hook_or_its_libcuda_mount(
        tmp_path: Path, hook: bool, driver: str, rc: int) -> None:
    """The regeneration's own check on a real spec, with and without the hook argument that
    toolkits before 1.17.5 do not write: the spec must be of the wanted driver."""
    text = REAL_SPEC.read_text()
    if not hook:
        text = text.replace("--host-driver-version=570.133.20", "--other")
    (tmp_path / "spec.yaml").write_text(text)
    fake = tmp_path / "nvidia-ctk"  # writes the spec where --output says
    fake.write_text(f"#!/bin/sh\ncp {tmp_path / 'spec.yaml'} \"${{3#--output=}}\"\n")
    fake.chmod(0o755)
    spec = tmp_path / "etc-cdi-nvidia.yaml"
    inv = inventory(tmp_path, PODMAN + f"nvidia_cdi_spec: {spec}\n"
                    f'nvidia_driver_version: "{driver}"\n')
    [change] = plan(inv, node(h200_gpus(), driver, s=FileState(str(spec), False)))
    [step] = change.steps
    assert isinstance(step, Run)
    done = subprocess.run(["sh", "-c", step.command], capture_output=True, text=True,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=False)
    assert done.returncode == rc, done.stderr
    assert (rc == 0) or f"not of driver {driver}" in done.stderr
