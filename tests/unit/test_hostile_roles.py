"""Role variables checked once, before any host is contacted: values that would reach a
rendered file or a command line are refused with host, variable and place; the commands
exit 2 without touching a host."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpufleet import app, roles
from gpufleet.bootstrap import bootstrap_vars, preflight_problems
from gpufleet.facts.gather import Facts
from gpufleet.inventory.model import Inventory, load_inventory
from gpufleet.provision.engine import BadVariables, validate


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
                                   "disk_free": {"/": 50e9}, "time_sync": True, "clock": 1.0})
    assert preflight_problems(facts, fixed.hosts["gpu01"], 1.0) == []
