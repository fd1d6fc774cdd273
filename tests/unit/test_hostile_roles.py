"""Role variables checked once, before any host is contacted: values that would reach a
rendered file or a command line are refused with host, variable and place; the commands
exit 2 without touching a host."""

from __future__ import annotations

import contextlib
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpufleet import app, roles
from gpufleet.bootstrap import bootstrap_vars, preflight_problems
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import FactMissing, FactRequest, Facts
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.provision.engine import BadVariables, validate
from gpufleet.provision.role import PlanContext, Role, RoleVars


def inventory(tmp_path: Path, host_vars: str) -> Inventory:
    body = ("all:\n  hosts:\n    gpu01:\n      ansible_connection: local\n"
            + textwrap.indent(textwrap.dedent(host_vars), " " * 6))
    (tmp_path / "hosts.yml").write_text(body)
    return load_inventory(tmp_path / "hosts.yml")


@pytest.mark.parametrize(("variables", "message"), [
    ('nccl_version: "2.21.5"\nnccl_cuda: "12.4"\nnccl_package_version: "{versoin}-1"\n',
     "nccl_packages or nccl_package_version has an unknown placeholder ('versoin')"),
    ('nccl_version: "2.21.5\\nPackage: *"\nnccl_cuda: "12.4"\n',
     "variable nccl_package_version gives '2.21.5\\nPackage: *-1+cuda12.4', which is not a "
     "package version"),
    ('cuda_version: "12.4.1"\ncuda_packages: ["cuda-toolkit; touch /x"]\n',
     "variable cuda_packages gives 'cuda-toolkit; touch /x', which is not a package name"),
    ('nvidia_driver_version: "580.95.05"\nnvidia_driver_packages: ["nvidia-open-{brnach}"]\n',
     "has an unknown placeholder ('brnach')"),
    ('nccl_env: {NCCL_DEBUG: WARN}\nnccl_env_file: "/etc/default/x\\nrm -rf /"\n',
     "variable nccl_env_file must be an absolute path of letters, digits and . _ - /"),
    ("firewall_enabled: true\ngpufleet_controllers: [10.0.0.1]\n"
     "firewall_ruleset_path: \"/etc/x'; reboot; '\"\n",
     "variable firewall_ruleset_path must be an absolute path"),
    ("firewall_enabled: true\ngpufleet_controllers: [10.0.0.1]\nfirewall_open_tcp_ports: [70000]\n",
     "firewall_open_tcp_ports value 70000 is not a TCP port (1-65535)"),
    ("firewall_enabled: true\ngpufleet_controllers: [10.0.0.1]\nfirewall_guard_seconds: 0\n",
     "variable firewall_guard_seconds must be at least 5"),
])
def test_bad_values_are_refused_before_any_host_is_touched(
        tmp_path: Path, variables: str, message: str) -> None:
    inv = inventory(tmp_path, variables)
    with pytest.raises(BadVariables) as caught:
        validate(list(inv.hosts.values()), roles.ALL)
    assert message in str(caught.value)
    assert str(caught.value).startswith("host gpu01: ")


@pytest.mark.parametrize(("variables", "message"), [
    ('nvidia_driver_version: "580.95.05\\n"\n', "nvidia_driver_version must look like"),
    ('enroot_version: "3.5.0-1"\nenroot_mounts: ["/data\\n"]\n',
     "variable enroot_mounts must be absolute paths"),
    ('enroot_version: "3.5.0-1"\nenroot_shm_size: "64g\\n"\n', "enroot_shm_size must be"),
    ('enroot_version: "3.5.0-1"\nenroot_settings: {ENROOT_ROOTFS_WRITABLE: "yes\\n"}\n',
     "enroot_settings ENROOT_ROOTFS_WRITABLE"),
    ('nccl_env: {"NCCL_DEBUG\\n": WARN}\n', "nccl_env"),
    ('nccl_env: {NCCL_DEBUG: WARN}\nnccl_env_file: "/etc/default/nccl\\n"\n',
     "variable nccl_env_file must be an absolute path"),
    ('cuda_version: "12.4.1\\n"\n', "cuda_version"),
    ('nccl_version: "2.21.5"\nnccl_cuda: "12.4"\nnccl_package_version: "{version}-1\\n"\n',
     "which is not a package version"),
    ('nvidia_repo: true\nnvidia_repo_keyring: /dev/null\n'
     'nvidia_repo_url: "https://mirror.example.com/cuda/\\n"\n', "nvidia_repo_url must be"),
])
def test_values_ending_in_a_line_break_are_refused(tmp_path: Path, variables: str,
                                                   message: str) -> None:
    """A trailing line break passes a pattern that ends in ``$``: it would add a line to a
    rendered file (enroot's mounts, the apt pin) or end a shell line."""
    inv = inventory(tmp_path, variables)
    with pytest.raises(BadVariables) as caught:
        validate(list(inv.hosts.values()), roles.ALL)
    assert message in str(caught.value)


def test_the_command_exits_2_naming_the_place(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    inventory(tmp_path, "firewall_enabled: yes\ngpufleet_controllers: [10.0.0.1]\n"
                        "firewall_guard_seconds: soon\n")
    assert app.provision_cmd(str(tmp_path / "hosts.yml"),
                             fleet=app.FleetArgs(timeout=5)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: host gpu01: variable firewall_guard_seconds must be an "
                          "integer, got 'soon' (")
    assert "hosts.yml:7)" in err


def test_bootstrap_variables_are_typed(tmp_path: Path) -> None:
    inv = inventory(tmp_path, 'bootstrap_supported_os: "ubuntu:24.04, debian:12"\n'
                              "bootstrap_min_free_gb: lots\n")
    host = inv.hosts["gpu01"]
    with pytest.raises(Exception, match=r"variable bootstrap_min_free_gb must be a number, "
                                        r"got 'lots' \(.*hosts\.yml:6\)"):
        bootstrap_vars(host)
    fixed = inventory(tmp_path, 'bootstrap_supported_os: "ubuntu:24.04, debian:12"\n')
    facts = Facts("gpu01", values={"os_release": {"ID": "debian", "VERSION_ID": "12"},
                                   "disk_free": {"/": 50e9}, "clock": 1.0,
                                   "time_sync": {"source": "chrony", "synchronised": True,
                                                 "offset_s": 0.0001, "server": None}})
    assert preflight_problems(facts, fixed.hosts["gpu01"], 1.0) == []


# Every role validates every variable it reads, whichever roles are selected -------------------

HOSTILE = "580.95.05'; touch /tmp/gpufleet-pwned; echo '\n"
HOSTILE_FORMS: list[Any] = [HOSTILE, [HOSTILE], {"NCCL_X": HOSTILE}]

# The least each role needs to be active (and valid): the walk below starts from these.
ACTIVE = {
    "nvidia_repo": {"nvidia_repo": True, "nvidia_repo_keyring": "/dev/null"},
    "kernel": {"kernel_version": "6.8.0-45-generic", "nvidia_driver_version": "580.95.05",
               "gpudirect_rdma": True, "ofed_version": "24.10-1.1.4.0"},
    "driver": {"nvidia_driver_version": "580.95.05"},
    "fabricmanager": {"nvidia_driver_version": "580.95.05", "nvidia_fabricmanager": True},
    "persistenced": {"nvidia_persistence_mode": True},
    "gpu_settings": {"nvidia_driver_version": "580.95.05", "gpu_state_power_limit_w": 600,
                     "gpu_state_app_clocks": "3201,1980", "gpu_state_compute_mode": "default",
                     "gpu_state_manage": ["mig", "ecc", "power_limit", "app_clocks",
                                          "locked_clocks", "compute_mode"]},
    "cuda": {"cuda_version": "12.4.1"},
    "nccl": {"nccl_version": "2.21.5", "nccl_cuda": "12.4"},
    "dcgm": {"dcgm_version": "3.3.9", "dcgm_cuda": "12"},
    "container_toolkit": {"container_engine": "docker",
                          "nvidia_container_toolkit_version": "1.17.8-1",
                          "nvidia_driver_version": "580.95.05"},
    "enroot_pyxis": {"enroot_version": "3.5.0-1", "pyxis_version": "0.20.0-1",
                     "shared_mounts": [{"path": "/data"}]},
    "ofed": {"ofed_version": "24.10-1.1.4.0", "ofed_package": "doca-ofed"},
    "peermem": {"gpudirect_rdma": True},
    "roce_qos": {"roce_qos": True, "rdma": {"pfc_priority": 3, "trust": "dscp", "ecn": True},
                 "roce_qos_ports": ["fab0"]},
    "pytorch": {"pytorch_version": "2.13.0", "pytorch_cuda": "12.6",
                "pytorch_index_url": "https://download.pytorch.org/whl/cu126"},
    "nccl_env": {"nccl_env": {"NCCL_SOCKET_IFNAME": "eth0"}, "gloo_socket_ifname": "eth0"},
    "host_tuning": {"nvidia_driver_version": "580.95.05",
                    "fabric_interfaces": ["fab0", "fab1"], "host_thp_enabled": "never",
                    "host_thp_defrag": "madvise", "host_max_cstate": 1},
    "pcie": {"pcie_acs_disable": True},
    "slurm_healthcheck": {"slurm_healthcheck": True, "nccl_env": {"NCCL_DEBUG": "WARN"}},
    "slurm_node": {"slurm_node": True, "slurm_gres_conf_manage": True, "slurm_gres_type": "h200",
                   "slurm_cgroup_conf_manage": True, "slurm_prolog": True,
                   "slurm_epilog": True, "gpu_count": 8},
    "firmware": {"firmware_pins": {"hca": "28.39.1002", "vbios": "96.00.A5.00.1A",
                                   "gsp": "580.159.04", "bios": "2.1.V1"}},
    "firewall": {"firewall_enabled": True, "gpufleet_controllers": ["10.0.0.1"],
                 "firewall_ssh_cidrs": ["10.1.0.0/16"], "firewall_extra_cidrs": ["10.2.0.0/16"]},
}


def host_inventory(tmp_path: Path, values: dict[str, Any]) -> Inventory:
    (tmp_path / "hosts.json").write_text(json.dumps(
        {"all": {"hosts": {"gpu01": {"ansible_host": "192.0.2.1", **values}}}}))
    return load_inventory(tmp_path / "hosts.json")


def fresh_node(request: FactRequest) -> Facts:
    """Facts of a node with nothing installed yet: every file, link and package the role
    asks for is absent, so its plan writes and runs everything it would."""
    values: dict[str, Any] = {"packages": {}, "arch": "x86_64", "systemd": True,
                              "os_release": {"ID": "ubuntu", "VERSION_ID": "24.04"}}
    values.update({f"file:{path}": FileState(path, False) for path in request.files})
    values.update({f"link:{path}": None for path in request.links})
    values.update({f"sysctl:{key}": "" for key in request.sysctls})
    return Facts("gpu01", values=values)


def variables_read(role: Role, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Every variable the role reads (its own and through another role's helpers) while it
    is checked, asks for facts and plans a fresh node."""
    read: set[str] = set()
    get = RoleVars.get

    def recording(self: RoleVars, key: str, default: Any = None) -> Any:
        read.add(key)
        return get(self, key, default)

    inventory = host_inventory(tmp_path, ACTIVE[role.name])
    host = inventory.hosts["gpu01"]
    with monkeypatch.context() as patched:
        patched.setattr(RoleVars, "get", recording)
        v = RoleVars(host, role.defaults)
        role.check(v)
        assert role.active(v)
        request = role.request(v)
        role.managed_files(v)
        role.provides(v)
        # a fact only a real node has ends the plan: what was read up to it is kept
        with contextlib.suppress(FactMissing):
            role.plan(fresh_node(request), v, PlanContext(inventory, host))
    return read


def test_every_role_is_walked() -> None:
    assert sorted(ACTIVE) == sorted(role.name for role in roles.ALL)


@pytest.mark.parametrize("role", roles.ALL, ids=lambda role: role.name)
def test_every_variable_a_role_reads_is_validated_by_that_role_alone(
        role: Role, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile value in any variable the role reads (or declares) is refused by the role
    itself, selected alone, before any host is contacted: never rendered into a command or
    a file because another role would have checked it."""
    keys = variables_read(role, tmp_path, monkeypatch) | set(role.variables)
    accepted = []
    for key in sorted(keys - {"ansible_host"}):
        for hostile in HOSTILE_FORMS:
            host = host_inventory(tmp_path, {**ACTIVE[role.name], key: hostile}).hosts["gpu01"]
            try:
                validate([host], [role])
            except BadVariables as exc:
                assert str(exc).startswith("host gpu01: ")
                continue
            accepted.append(f"{key}={hostile!r}")
    assert accepted == []


def test_provision_of_the_container_toolkit_alone_refuses_a_hostile_driver_version(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory(tmp_path, "container_engine: docker\n"
                        "nvidia_container_toolkit_version: 1.17.8-1\n"
                        "nvidia_driver_version: \"580.95.05'; touch /tmp/x; echo '\"\n")
    assert app.provision_cmd(str(tmp_path / "hosts.yml"), roles="container_toolkit",
                             fleet=app.FleetArgs(timeout=5)) == 2
    err = capsys.readouterr().err
    assert err == ("error: host gpu01: nvidia_driver_version must look like 580.95.05, got "
                   "\"580.95.05'; touch /tmp/x; echo '\"\n")
