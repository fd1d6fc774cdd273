"""The NVIDIA stack as NVIDIA ships it: driver sources and flavours (and preinstalled drivers),
CUDA by release, NVIDIA's repository, fabricmanager, persistence mode, DCGM, OFED and
GPUDirect RDMA; their parsers on real output, and the lab's stand-ins against the real
node's package list (../shared/samples/real-node, copied under tests/fixtures/real-node)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpufleet import roles
from gpufleet.conformance.checks.gpu import fabric_problems, fabricmanager_problem
from gpufleet.errors import GpufleetError, VarError
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import Facts
from gpufleet.facts.parsers.cuda import nvcc_version
from gpufleet.facts.parsers.dcgm import dcgm_diag
from gpufleet.facts.parsers.nvidia_smi import nvidia_smi_q, nvidia_smi_query
from gpufleet.facts.parsers.packages import ofed_version
from gpufleet.facts.parsers.system import (
    gpu_operator,
    proc_driver_flavor,
    proc_driver_version,
    secure_boot,
)
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.lab.repo import standins
from gpufleet.provision import apt
from gpufleet.provision.plan import Change, Fail, Run
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles import (
    cuda,
    dcgm,
    driver,
    fabricmanager,
    nvidia_repo,
    ofed,
    peermem,
    persistenced,
)
from tests.conftest import ROOT

H200 = ROOT / "tests" / "fixtures" / "h200x2"
REAL = ROOT / "tests" / "fixtures" / "real-node"


def host_vars(tmp_path: Path, text: str) -> Inventory:
    body = "all:\n  hosts:\n    gpu01:\n      ansible_host: 10.0.0.11\n" + \
        textwrap.indent(textwrap.dedent(text), " " * 6)
    (tmp_path / "hosts.yml").write_text(body)
    return load_inventory(tmp_path / "hosts.yml")


def role_vars(role: Any, inv: Inventory) -> RoleVars:
    return RoleVars(inv.hosts["gpu01"], role.defaults)


def plan(role: Any, inv: Inventory, facts: Facts) -> list[Change]:
    host = inv.hosts["gpu01"]
    return role.plan(facts, RoleVars(host, role.defaults), PlanContext(inv, host))


def rows(changes: list[Change]) -> list[tuple[str, str, str | None, str | None]]:
    return [(c.item, c.action, c.before, c.after) for c in changes]


def installed(version: str, hold: bool = True) -> dict[str, Any]:
    return {"version": version, "status": "hold ok installed", "installed": True, "hold": hold}


def files(*paths: str) -> dict[str, FileState]:
    return {f"file:{p}": FileState(p, False) for p in paths}


# --------------------------------------------------------------------------- driver


@pytest.mark.parametrize(("source", "flavor", "version", "packages"), [
    ("cuda-repo", "open", "580.95.05", {"nvidia-open-580": "580.95.05-*"}),
    ("cuda-repo", "proprietary", "580.95.05", {"cuda-drivers-580": "580.95.05-*"}),
    ("ubuntu", "open", "580.95.05", {"nvidia-driver-580-server-open": "580.95.05-*"}),
    ("ubuntu", "proprietary", "580.95.05", {"nvidia-driver-580-server": "580.95.05-*"}),
    ("debian", "open", "535.216.01", {"nvidia-driver": "535.216.01-*",
                                      "nvidia-kernel-open-dkms": "535.216.01-*"}),
    ("debian", "proprietary", "535.216.01", {"nvidia-driver": "535.216.01-*",
                                             "nvidia-kernel-dkms": "535.216.01-*"}),
])
def test_each_driver_source_names_its_packages(tmp_path: Path, source: str, flavor: str,
                                               version: str, packages: dict[str, str]) -> None:
    inv = host_vars(tmp_path, f'nvidia_driver_version: "{version}"\n'
                              f"nvidia_driver_source: {source}\nnvidia_driver_flavor: {flavor}\n")
    assert driver.ROLE.wanted(role_vars(driver.ROLE, inv)) == packages


@pytest.mark.parametrize(("version", "flavor"), [("550.127.05", "proprietary"),
                                                  ("580.95.05", "open")])
def test_the_default_flavour_is_nvidias_for_the_branch(tmp_path: Path, version: str,
                                                       flavor: str) -> None:
    inv = host_vars(tmp_path, f'nvidia_driver_version: "{version}"\n')
    assert driver.ROLE.flavor(role_vars(driver.ROLE, inv)) == flavor


def test_a_package_at_any_revision_of_the_version_is_converged() -> None:
    assert apt.matches("580.95.05-0ubuntu0.24.04.2", "580.95.05-*")
    assert not apt.matches("580.105.08-1", "580.95.05-*")
    assert apt.resolve("nvidia-open-580", "580.95.05-*",
                       ["580.105.08-1", "580.95.05-1", "580.95.05-2"]) == "580.95.05-2"
    with pytest.raises(GpufleetError, match=r"no version of nvidia-open-580 matching "
                                            r"575\.\*-\* is available"):
        apt.resolve("nvidia-open-580", "575.*-*", ["580.95.05-1"])


PREINSTALLED = ('nvidia_driver_version: "580.159.04"\nnvidia_driver_install: preinstalled\n'
                "nvidia_driver_flavor: open\n")


def real_module_facts(**values: Any) -> Facts:
    text = (REAL / "real-driver-h200x2.txt").read_text()
    facts = Facts("gpu01", values={"nvidia_module": proc_driver_version(text),
                                   "nvidia_module_flavor": proc_driver_flavor(text),
                                   **files(driver.UNATTENDED_PATH)})
    facts.values.update(values)
    return facts


def test_a_preinstalled_open_driver_is_verified_and_manages_no_package(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, PREINSTALLED)
    v = role_vars(driver.ROLE, inv)
    assert driver.ROLE.wanted(v) == {}
    assert driver.ROLE.request(v).packages == frozenset()
    assert plan(driver.ROLE, inv, real_module_facts()) == []


def test_a_preinstalled_driver_of_another_version_or_flavour_cannot_be_fixed(
        tmp_path: Path) -> None:
    inv = host_vars(tmp_path, PREINSTALLED.replace("flavor: open", "flavor: proprietary"))
    [change] = plan(driver.ROLE, inv, real_module_facts())
    assert rows([change]) == [("driver/kernel module nvidia", "verify", "580.159.04 (open)",
                               "580.159.04 (proprietary)")]
    [step] = change.steps
    assert isinstance(step, Fail) and "the host image provides the driver" in step.message


def test_the_gpu_operator_s_driver_is_verified_never_installed(tmp_path: Path) -> None:
    assert gpu_operator("operator\n") and not gpu_operator("none\n")
    run_by_operator = real_module_facts(gpu_operator=True)
    operator = host_vars(tmp_path, PREINSTALLED.replace("preinstalled", "operator"))
    assert driver.ROLE.request(role_vars(driver.ROLE, operator)).packages == frozenset()
    assert driver.GPU_OPERATOR in driver.ROLE.request(role_vars(driver.ROLE, operator)).custom
    assert plan(driver.ROLE, operator, run_by_operator) == []
    [other] = plan(driver.ROLE, host_vars(tmp_path, PREINSTALLED.replace(
        "preinstalled", "operator").replace("580.159.04", "580.95.05")), run_by_operator)
    [step] = other.steps
    assert isinstance(step, Fail) and step.message == (
        "the GPU Operator provides the driver: loaded 580.159.04 (open), the inventory wants "
        "580.95.05 (open); set the operator's driver version (ClusterPolicy "
        "spec.driver.version)")
    [refused] = plan(driver.ROLE, host_vars(tmp_path, 'nvidia_driver_version: "580.159.04"\n'),
                     run_by_operator)
    assert rows([refused]) == [("driver/driver", "verify", "run by NVIDIA's GPU Operator",
                                "installed from apt")]
    assert "gpufleet does not install or remove a driver under it" in \
        refused.steps[0].message  # type: ignore[union-attr]
    [absent] = plan(driver.ROLE, operator, real_module_facts(gpu_operator=False))
    assert "no GPU Operator driver runs on this node" in \
        absent.steps[0].message  # type: ignore[union-attr]


def test_an_apt_driver_in_the_wrong_flavour_needs_a_reboot(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, 'nvidia_driver_version: "580.159.04"\nnvidia_driver_flavor: '
                              "proprietary\nnvidia_driver_protect_from_unattended_upgrades: "
                              "false\n")
    facts = real_module_facts(packages={"cuda-drivers-580": installed("580.159.04-1")})
    facts.values[f"file:{apt.pin_path('driver')}"] = FileState(
        apt.pin_path("driver"), True, apt.pin_content("driver", {
            "cuda-drivers-580": "580.159.04-*"}).encode(), "644", "root:root")
    changes = plan(driver.ROLE, inv, facts)
    assert rows(changes) == [("driver/kernel module nvidia", "reboot", "580.159.04 (open)",
                              "580.159.04 (proprietary)")]
    assert changes[0].pending_reboot


def test_a_dkms_build_failure_is_named() -> None:
    message = driver.diagnose("Setting up nvidia-dkms-570 ...\n" + driver.DKMS_FAILURE
                              + "dpkg: error processing package nvidia-dkms-570\n")
    assert message == ("DKMS could not build the NVIDIA kernel module for kernel "
                       "6.8.0-45-generic (are its headers installed? "
                       "linux-headers-6.8.0-45-generic); see "
                       "/var/lib/dkms/nvidia/570.86.10/build/make.log")


def test_a_module_refused_by_secure_boot_is_named() -> None:
    message = driver.diagnose("modprobe: ERROR: could not insert 'nvidia': Key was rejected "
                              "by service\n")
    assert message is not None and message.startswith(
        "the kernel refused the NVIDIA module: Secure Boot is on")
    assert driver.diagnose("E: Unable to locate package nvidia-open-580") is None


@pytest.mark.parametrize("entry", ['nvidia-";\n};\nDPkg::Post-Invoke {"touch /x', "a b", "x;y"])
def test_a_blacklist_entry_cannot_change_apt_conf_syntax(tmp_path: Path, entry: str) -> None:
    inv = host_vars(tmp_path, 'nvidia_driver_version: "550.127.05"\n'
                              f"nvidia_driver_unattended_blacklist: {json.dumps([entry])}\n")
    with pytest.raises(VarError, match=r"nvidia_driver_unattended_blacklist entry .* is not a "
                                       r"package name prefix"):
        driver.ROLE.check(role_vars(driver.ROLE, inv))


def test_module_flavour_and_secure_boot_parsers() -> None:
    real = (REAL / "real-driver-h200x2.txt").read_text()
    assert proc_driver_flavor(real) == "open"
    assert proc_driver_flavor((H200 / "proc_nvidia_version.txt").read_text()) == "open"
    assert proc_driver_flavor(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct 8\n") == \
        "proprietary"
    assert secure_boot("SecureBoot enabled\n") is True
    assert secure_boot("SecureBoot disabled\nPlatform is in Setup Mode\n") is False


# --------------------------------------------------------------------------- cuda


def cuda_facts(release: str = "13.0.2", nvcc: str = "13.0.88", **values: Any) -> Facts:
    pin = apt.pin_path("cuda")
    return Facts("gpu01", values={
        "packages": {"cuda-toolkit-13-0": installed(f"{release}-1")},
        f"file:{pin}": FileState(pin, True, apt.pin_content(
            "cuda", {"cuda-toolkit-13-0": "13.0.2-1"}).encode(), "644", "root:root"),
        "link:/usr/local/cuda": "/usr/local/cuda-13.0", "link:/etc/alternatives/cuda": None,
        "nvcc": nvcc, **values})


def test_cuda_pins_the_metapackages_at_the_release_version(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, 'cuda_version: "13.0.2"\ncuda_packages: ["cuda-compiler-{major}-'
                              '{minor}", "cuda-libraries-{major}-{minor}"]\n')
    assert cuda.ROLE.wanted(role_vars(cuda.ROLE, inv)) == {
        "cuda-compiler-13-0": "13.0.2-1", "cuda-libraries-13-0": "13.0.2-1"}


def test_cuda_as_major_minor_is_the_one_release_available(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, 'cuda_version: "13.0"\n')
    assert cuda.ROLE.wanted(role_vars(cuda.ROLE, inv)) == {"cuda-toolkit-13-0": "13.0.*-1"}
    assert apt.resolve("cuda-toolkit-13-0", "13.0.*-1", ["13.0.2-1"]) == "13.0.2-1"
    with pytest.raises(GpufleetError, match=r"13\.0\.\*-1 is ambiguous, the repositories offer "
                                            r"13\.0\.2-1, 13\.0\.1-1; pin the exact version"):
        apt.resolve("cuda-toolkit-13-0", "13.0.*-1", ["13.0.1-1", "13.0.2-1"])


def test_a_converged_release_has_its_own_nvcc(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, 'cuda_version: "13.0.2"\n')
    assert plan(cuda.ROLE, inv, cuda_facts()) == []
    [change] = plan(cuda.ROLE, inv, cuda_facts(nvcc="12.6.77"))
    assert rows([change]) == [("cuda/component nvcc", "verify", "nvcc 12.6.77",
                               "nvcc 13.0.88 of CUDA 13.0.2")]
    assert isinstance(change.steps[0], Fail)


def test_version_json_must_name_the_release(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, 'cuda_version: "13.0.2"\n')
    [change] = plan(cuda.ROLE, inv, cuda_facts(cuda_version_json="13.0.1"))
    assert change.item == "cuda/component version.json"


def test_a_preinstalled_toolkit_is_only_verified(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, 'cuda_version: "13.0.2"\ncuda_install: preinstalled\n')
    facts = Facts("gpu01", values={
        "packages": {}, "link:/usr/local/cuda": "/usr/local/cuda-13.0",
        "link:/etc/alternatives/cuda": None,
        "nvcc": nvcc_version((H200 / "nvcc_version.txt").read_text())})
    assert plan(cuda.ROLE, inv, facts) == []


def test_a_release_not_in_the_table_checks_the_release_line(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, 'cuda_version: "13.9.0"\ncuda_install: preinstalled\n')
    facts = Facts("gpu01", values={"link:/usr/local/cuda": "/usr/local/cuda-13.9",
                                   "link:/etc/alternatives/cuda": None, "nvcc": "13.9.20"})
    assert plan(cuda.ROLE, inv, facts) == []
    assert cuda.NVCC_OF_RELEASE["13.0.2"] == "13.0.88"  # the real node's pair


# --------------------------------------------------------------------------- repository


def test_nvidias_repository_keyring_sources_and_pin(tmp_path: Path) -> None:
    keyring = tmp_path / "cuda-archive-keyring.gpg"
    keyring.write_bytes(b"\x99\x01\x0dbinary keyring")
    inv = host_vars(tmp_path, f"nvidia_repo: true\nnvidia_repo_keyring: {keyring}\n")
    v = role_vars(nvidia_repo.ROLE, inv)
    nvidia_repo.ROLE.check(v)
    facts = Facts("gpu01", values={"os_release": {"ID": "ubuntu", "VERSION_ID": "24.04"},
                                   "arch": "x86_64", **files(
                                       *nvidia_repo.ROLE.request(v).files)})
    changes = plan(nvidia_repo.ROLE, inv, facts)
    assert [c.item for c in changes] == [
        "nvidia_repo/file /usr/share/keyrings/cuda-archive-keyring.gpg",
        "nvidia_repo/file /etc/apt/sources.list.d/cuda.list",
        "nvidia_repo/file /etc/apt/preferences.d/cuda-repository-pin-600"]
    assert {c.kind for c in changes} == {"apt-repo"}
    assert changes[0].steps[0].content == keyring.read_bytes()  # type: ignore[attr-defined]
    assert changes[0].diff is None
    sources = changes[1].steps[0].content.decode()  # type: ignore[attr-defined]
    assert sources.splitlines()[-1] == (
        "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/ /")
    pin = changes[2].steps[0].content.decode()  # type: ignore[attr-defined]
    assert "Package: *\nPin: release o=NVIDIA,l=NVIDIA CUDA\nPin-Priority: 600\n" in pin


@pytest.mark.parametrize(("extra", "message"), [
    ("", "nvidia_repo is true but nvidia_repo_keyring is not set"),
    ("nvidia_repo_keyring: /nonexistent/key.gpg\n", "cannot read /nonexistent/key.gpg"),
])
def test_the_repository_needs_a_readable_keyring(tmp_path: Path, extra: str,
                                                 message: str) -> None:
    inv = host_vars(tmp_path, "nvidia_repo: true\n" + extra)
    with pytest.raises(VarError, match=message):
        nvidia_repo.ROLE.check(role_vars(nvidia_repo.ROLE, inv))


def test_a_repository_url_cannot_inject_a_sources_line(tmp_path: Path) -> None:
    key = tmp_path / "k.gpg"
    key.write_bytes(b"k")
    inv = host_vars(tmp_path, f"nvidia_repo: true\nnvidia_repo_keyring: {key}\n"
                              "nvidia_repo_url: 'http://m/ /\\ndeb http://evil/ /'\n")
    facts = Facts("gpu01", values={"os_release": {}, "arch": "x86_64"})
    with pytest.raises(VarError, match="nvidia_repo_url must be an http"):
        plan(nvidia_repo.ROLE, inv, facts)


# --------------------------------------------------------------------------- HGX services


FM = 'nvidia_driver_version: "580.95.05"\n'


def fm_facts(switches: int, service: dict[str, str] | None = None, **packages: Any) -> Facts:
    facts = Facts("gpu01", values={"nvswitches": switches, "packages": packages,
                                   **files(apt.pin_path("fabricmanager"))})
    if service is None:
        facts.absent["fabricmanager_service"] = "no systemd on this host"
    else:
        facts.values["fabricmanager_service"] = service
    return facts


def test_fabricmanager_is_on_by_itself_where_nvswitches_are(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, FM)
    assert fabricmanager.ROLE.active(role_vars(fabricmanager.ROLE, inv))
    assert plan(fabricmanager.ROLE, inv, fm_facts(0)) == []
    changes = plan(fabricmanager.ROLE, inv, fm_facts(4, {"enabled": "disabled",
                                                         "active": "inactive"}))
    assert rows(changes) == [
        ("fabricmanager/package nvidia-fabricmanager-580", "install", "not installed",
         "580.95.05-*"),
        ("fabricmanager/file /etc/apt/preferences.d/gpufleet-fabricmanager.pref", "create",
         "absent", changes[1].after),
        ("fabricmanager/service nvidia-fabricmanager", "start", "disabled inactive",
         "enabled active")]
    assert isinstance(changes[2].steps[0], Run)


def test_fabricmanager_of_another_version_than_the_driver_is_drift(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, FM + "nvidia_fabricmanager: true\n")
    changes = plan(fabricmanager.ROLE, inv, fm_facts(
        4, {"enabled": "enabled", "active": "active"},
        **{"nvidia-fabricmanager-580": installed("580.105.08-1")}))
    assert rows(changes)[0] == ("fabricmanager/package nvidia-fabricmanager-580", "change",
                                "580.105.08-1", "580.95.05-*")


def test_fabricmanager_without_systemd_says_so(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, FM + "nvidia_fabricmanager: true\n")
    changes = plan(fabricmanager.ROLE, inv, fm_facts(0))
    assert changes[-1].before == "unknown (no systemd on this host)"
    assert isinstance(changes[-1].steps[0], Fail)


def test_fabricmanager_on_without_a_driver_version_is_refused(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, "nvidia_fabricmanager: true\n")
    with pytest.raises(VarError, match="nvidia_driver_version must be set when "
                                       "nvidia_fabricmanager is on"):
        fabricmanager.ROLE.check(role_vars(fabricmanager.ROLE, inv))


def test_persistence_mode(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, "nvidia_persistence_mode: true\n")
    gpus = nvidia_smi_query((H200 / "query_gpu_csv.txt").read_text())
    assert plan(persistenced.ROLE, inv, Facts("gpu01", values={"gpus": gpus})) == []
    gpus[1]["persistence_mode"] = False
    [change] = plan(persistenced.ROLE, inv, Facts("gpu01", values={"gpus": gpus,
                                                                   "systemd": True}))
    assert (change.before, change.steps[0].describe()) == (
        "off on GPU1", "systemctl enable --now nvidia-persistenced")


def test_peermem_loaded_now_and_at_boot(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, "gpudirect_rdma: true\n")
    facts = Facts("gpu01", values={"gpudirect": {
        "kernel": "6.8.0-90-generic", "peermem_loaded": False, "nvidia_loaded": True,
        "peermem_file": None, "flavor": "proprietary", "dma_buf": True, "nccl_conf": {}},
        **files(peermem.MODULES_LOAD)})
    assert [c.item for c in plan(peermem.ROLE, inv, facts)] == [
        f"peermem/file {peermem.MODULES_LOAD}", "peermem/module nvidia_peermem"]


def test_ofed_version_is_drift_and_its_package_is_pinned(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, 'ofed_version: "24.10-1.1.4.0"\n')
    [change] = plan(ofed.ROLE, inv, Facts("gpu01", values={"ofed": "24.07-0.6.1.0"}))
    assert (change.before, change.after, change.kind) == ("24.07-0.6.1.0", "24.10-1.1.4.0",
                                                          "ofed")
    pinned = host_vars(tmp_path, 'ofed_version: "24.10-1.1.4.0"\nofed_package: doca-ofed\n')
    assert ofed.ROLE.wanted(role_vars(ofed.ROLE, pinned)) == {"doca-ofed": "24.10-1.1.4.0-*"}
    assert ofed_version("MLNX_OFED_LINUX-24.10-1.1.4.0:\n") == "24.10-1.1.4.0"
    assert ofed_version("OFED-internal-25.01-0.6.0:\n") == "25.01-0.6.0"


def test_dcgm_packages_follow_the_cuda_major(tmp_path: Path) -> None:
    inv = host_vars(tmp_path, 'dcgm_version: "4.4.1"\ncuda_version: "13.0.2"\n')
    assert dcgm.ROLE.wanted(role_vars(dcgm.ROLE, inv)) == {
        "datacenter-gpu-manager-4-core": "1:4.4.1-*",
        "datacenter-gpu-manager-4-cuda13": "1:4.4.1-*"}


# --------------------------------------------------------------------------- parsers


def test_fabric_state_and_persistence_per_gpu_from_nvidia_smi_q() -> None:
    assert nvidia_smi_q((H200 / "nvidia_smi_q.txt").read_text()) == [
        {"bus_id": "00000000:00:06.0", "persistence": "Enabled", "fabric_state": "Completed",
         "fabric_status": "Success"},
        {"bus_id": "00000000:00:07.0", "persistence": "Enabled", "fabric_state": "Completed",
         "fabric_status": "Success"}]


def test_dcgm_diag_in_both_layouts() -> None:
    three = json.dumps({"DCGM GPU Diagnostic": {"version": "3.3.9", "test_categories": [
        {"category": "Hardware", "tests": [{"name": "GPU Memory", "results": [
            {"gpu_ids": "0", "status": "Pass"},
            {"gpu_ids": "1", "status": "Fail", "info": ["GPU 1 has uncorrectable errors"]}]}]}]}})
    four = json.dumps({"version": "4.4.1", "tests": [{"name": "memory", "results": [
        {"entity_group": "GPU", "entity_id": 0, "status": "Pass"},
        {"entity_group": "GPU", "entity_id": 1, "status": "Skip"}]}]})
    assert [(t["gpu"], t["status"]) for t in dcgm_diag(three)["tests"]] == [
        ("0", "PASS"), ("1", "FAIL")]
    assert dcgm_diag(three)["tests"][1]["info"] == "GPU 1 has uncorrectable errors"
    assert [(t["gpu"], t["status"]) for t in dcgm_diag(four)["tests"]] == [
        ("0", "PASS"), ("1", "SKIP")]
    assert dcgm_diag(dcgm.diag_document())["version"] == "4.4.1"


# --------------------------------------------------------------------------- one unit each


def test_every_role_is_one_module_found_by_the_registry() -> None:
    names = [r.name for r in roles.ALL]
    for expected in ("nvidia_repo", "driver", "fabricmanager", "persistenced", "cuda",
                     "nccl", "dcgm", "ofed", "peermem", "pytorch", "nccl_env",
                     "slurm_node", "slurm_healthcheck", "firewall"):
        assert expected in names
    assert names == [r.name for r in sorted(roles.ALL, key=lambda r: r.order)]
    assert roles.owner_of("driver") == "driver" and roles.owner_of("torch") == "pytorch"
    assert roles.owner_of("kernel") is None


def test_the_lab_serves_the_real_nodes_package_versions() -> None:
    served = {(p.name, p.version) for p in standins()}
    real = {tuple(line.split("\t")[:2]) for line in
            (REAL / "real-dpkg-h200x2.txt").read_text().splitlines() if "\t" in line}
    for pair in [("cuda-compiler-13-0", "13.0.2-1"), ("cuda-libraries-13-0", "13.0.2-1"),
                 ("cuda-nvcc-13-0", "13.0.88-1"), ("cuda-cudart-13-0", "13.0.96-1"),
                 ("libnccl2", "2.28.3-1+cuda13.0"), ("libnccl-dev", "2.28.3-1+cuda13.0")]:
        assert pair in real and pair in served, pair
    nvcc = next(p for p in standins() if p.name == "cuda-nvcc-13-0")
    assert nvcc_version(nvcc.files["/usr/local/cuda-13.0/bin/nvcc"]) == "13.0.88"
    fm = next(p for p in standins() if p.name == "nvidia-fabricmanager-580"
              and p.version == "580.95.05-1")
    assert fm.depends == "nvidia-kernel-common-580-580.95.05"
    assert any("nvidia-kernel-common-580-580.95.05" in p.provides for p in standins()
               if p.name == "nvidia-open-580")


def test_a_gpu_without_nvswitch_fabric_has_no_fabric_problem() -> None:
    gpus = nvidia_smi_q((ROOT / "tests" / "fixtures" / "h200x1" /
                                 "nvidia_smi_q.txt").read_text())
    assert gpus == [{"bus_id": "00000000:00:06.0", "persistence": "Enabled",
                     "fabric_state": "N/A", "fabric_status": "N/A"}]
    assert fabric_problems(gpus) == []
    broken = [dict(gpus[0], fabric_state="In Progress", fabric_status="N/A")]
    assert fabric_problems(broken) == [
        "GPU0 (00000000:00:06.0): fabric state In Progress, status N/A (is "
        "nvidia-fabricmanager running at the driver's version?)"]
    assert fabricmanager_problem("580.95.05", "580.159.04") == (
        "nvidia-fabricmanager 580.95.05 but the loaded driver is 580.159.04")
    assert fabricmanager_problem(None, "580.159.04") is None


def test_the_real_h200_node_is_clean_with_its_inventory() -> None:
    """What drift said on the real node (captured there): every role converged."""
    reports = ROOT / "tests" / "fixtures" / "h200x1" / "gpufleet"
    drift = json.loads((reports / "drift.json").read_text())
    assert drift["summary"]["items"] == 0 and drift["hosts"]["gpu-local"]["status"] == "clean"
    inventory = load_inventory(ROOT / "inventory" / "h200-local.yml")
    facts = json.loads((reports / "facts.json").read_text())["hosts"]["gpu-local"]["facts"]
    text = (ROOT / "tests" / "fixtures" / "h200x1" / "proc_nvidia_version.txt").read_text()
    assert facts["nvidia_module"] == proc_driver_version(text) == "580.159.04"
    assert inventory.hosts["gpu-local"].vars["nvidia_driver_install"] == "preinstalled"
