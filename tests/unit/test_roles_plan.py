"""Role plans from hand-built facts and small inventories: driver, cuda, nccl, pytorch, nccl_env.

Each test states the exact (item, action, before, after) list a role returns.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import VarError
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.provision import apt
from gpufleet.provision.engine import active_roles, fact_request, plan_host
from gpufleet.provision.plan import Change, Run
from gpufleet.provision.reboot import Reboot
from gpufleet.provision.role import PlanContext, Role, RoleVars
from gpufleet.roles import ALL, cuda, driver, nccl, nccl_env, pytorch, select

Row = tuple[str, str, str | None, str | None]


def inventory(tmp_path: Path, host_vars: str = "") -> Inventory:
    """One host gpu01 (10.0.0.11) with the given YAML variables (indented as host vars)."""
    text = textwrap.dedent("""\
        all:
          hosts:
            gpu01:
              ansible_host: 10.0.0.11
        """) + textwrap.indent(textwrap.dedent(host_vars), " " * 6)
    path = tmp_path / "hosts.yml"
    path.write_text(text)
    return load_inventory(path)


def plan(role: Role, inv: Inventory, facts: Facts, host: str = "gpu01") -> list[Change]:
    h = inv.hosts[host]
    return role.plan(facts, RoleVars(h, role.defaults), PlanContext(inv, h))


def rows(changes: list[Change]) -> list[Row]:
    return [(c.item, c.action, c.before, c.after) for c in changes]


def installed(version: str, hold: bool = True) -> dict[str, Any]:
    return {"version": version, "status": f"{'hold' if hold else 'install'} ok installed",
            "installed": True, "hold": hold}


def present(path: str, content: str, mode: str = "644") -> FileState:
    return FileState(path, True, content.encode(), mode, "root:root")


def missing(path: str) -> FileState:
    return FileState(path, False)


def header(role: str) -> str:
    return f"Managed by gpufleet (role {role}); local edits are reported as drift and replaced."


def test_roles_are_applied_stack_first_firewall_last() -> None:
    names = [r.name for r in ALL]
    assert names[:3] == ["nvidia_repo", "kernel", "driver"] and names[-1] == "firewall"
    assert names.index("cuda") < names.index("nccl") < names.index("pytorch") < \
        names.index("nccl_env")
    assert [r.name for r in select("firewall, driver")] == ["driver", "firewall"]
    with pytest.raises(Exception, match=r"unknown role\(s\) drivers; roles are nvidia_repo, "
                                        r"kernel, driver"):
        select("drivers")


# =========================================================================== driver

DRIVER_PIN = apt.pin_path("driver")
UNATTENDED = driver.UNATTENDED_PATH
UNATTENDED_TEXT = (
    f"// {header('driver')}\n"
    "// Keeps unattended-upgrades away from the pinned GPU stack.\n"
    "Unattended-Upgrade::Package-Blacklist {\n"
    '    "nvidia-";\n'
    '    "libnvidia-";\n'
    '    "cuda-";\n'
    '    "libnccl";\n'
    "};\n")
DRIVER_PIN_TEXT = (f"# {header('driver')}\n\nPackage: nvidia-driver-550\n"
                   "Pin: version 550.127.05-0ubuntu1\nPin-Priority: 1001\n")


def driver_facts(version: str = "550.127.05-0ubuntu1", module: str | None = "550.127.05",
                 **extra: Any) -> Facts:
    values: dict[str, Any] = {
        "packages": {"nvidia-driver-550": installed(version)},
        f"file:{DRIVER_PIN}": present(DRIVER_PIN, DRIVER_PIN_TEXT),
        f"file:{UNATTENDED}": present(UNATTENDED, UNATTENDED_TEXT),
    }
    absent = {}
    if module is None:
        absent["nvidia_module"] = "no NVIDIA kernel module loaded"
    else:
        values["nvidia_module"] = module
    values.update(extra)
    return Facts("gpu01", values=values, absent=absent)


DRIVER_VARS = ('nvidia_driver_version: "550.127.05"\n'
               'nvidia_driver_package: "nvidia-driver-{branch}"\n'
               'nvidia_driver_package_version: "{version}-0ubuntu1"\n')


def test_driver_converged(tmp_path: Path) -> None:
    assert plan(driver.ROLE, inventory(tmp_path, DRIVER_VARS), driver_facts()) == []


def test_driver_request(tmp_path: Path) -> None:
    inv = inventory(tmp_path, DRIVER_VARS)
    v = RoleVars(inv.hosts["gpu01"], driver.ROLE.defaults)
    assert driver.ROLE.active(v)
    assert driver.ROLE.request(v) == FactRequest(
        packages=frozenset({"nvidia-driver-550"}), files=frozenset({DRIVER_PIN, UNATTENDED}),
        custom=frozenset({driver.MODULE_FLAVOR, driver.SECURE_BOOT, driver.GPU_OPERATOR}))
    assert not driver.ROLE.active(RoleVars(inventory(tmp_path).hosts["gpu01"],
                                           driver.ROLE.defaults))


def test_driver_reboot_when_module_absent(tmp_path: Path) -> None:
    changes = plan(driver.ROLE, inventory(tmp_path, DRIVER_VARS), driver_facts(module=None))
    assert rows(changes) == [
        ("driver/kernel module nvidia", "reboot", "not loaded (no NVIDIA kernel module loaded)",
         "550.127.05 (proprietary)")]
    [reboot] = changes
    assert reboot.pending_reboot and reboot.kind == "reboot"
    [step] = reboot.steps
    assert isinstance(step, Reboot)
    assert (step.command, step.reason) == (
        "reboot", "loaded kernel module not loaded (no NVIDIA kernel module loaded), driver "
                  "package 550.127.05 (proprietary)")


def test_driver_upgrade_with_old_module_loaded(tmp_path: Path) -> None:
    changes = plan(driver.ROLE, inventory(tmp_path, DRIVER_VARS),
                   driver_facts(version="550.54.15-0ubuntu1", module="550.54.15"))
    assert rows(changes) == [
        ("driver/package nvidia-driver-550", "upgrade", "550.54.15-0ubuntu1",
         "550.127.05-0ubuntu1"),
        ("driver/kernel module nvidia", "reboot", "550.54.15 (None)",
         "550.127.05 (proprietary)"),
    ]
    assert [c.pending_reboot for c in changes] == [False, True]
    assert changes[1].steps[0].reason == (  # type: ignore[attr-defined]
        "loaded kernel module 550.54.15 (None), driver package 550.127.05 (proprietary)")


def test_driver_fresh_host(tmp_path: Path) -> None:
    facts = Facts("gpu01", values={
        "packages": {},
        f"file:{DRIVER_PIN}": missing(DRIVER_PIN),
        f"file:{UNATTENDED}": missing(UNATTENDED),
    }, absent={"nvidia_module": "no NVIDIA kernel module loaded"})
    changes = plan(driver.ROLE, inventory(tmp_path, DRIVER_VARS), facts)
    assert rows(changes) == [
        ("driver/package nvidia-driver-550", "install", "not installed", "550.127.05-0ubuntu1"),
        (f"driver/file {DRIVER_PIN}", "create", "absent", f"{len(DRIVER_PIN_TEXT)} bytes"),
        (f"driver/file {UNATTENDED}", "create", "absent", f"{len(UNATTENDED_TEXT)} bytes"),
        ("driver/kernel module nvidia", "reboot", "not loaded (no NVIDIA kernel module loaded)",
         "550.127.05 (proprietary)"),
    ]
    assert changes[1].steps[0].content == DRIVER_PIN_TEXT.encode()  # type: ignore[attr-defined]
    assert changes[2].steps[0].content == UNATTENDED_TEXT.encode()  # type: ignore[attr-defined]


def test_driver_cuda_drivers_package_form(tmp_path: Path) -> None:
    inv = inventory(tmp_path, DRIVER_VARS + 'nvidia_driver_package: "cuda-drivers-{branch}"\n'
                    'nvidia_driver_package_version: "{version}-1"\n'
                    "nvidia_driver_protect_from_unattended_upgrades: false\n"
                    "nvidia_driver_reboot_command: systemctl reboot\n")
    v = RoleVars(inv.hosts["gpu01"], driver.ROLE.defaults)
    assert driver.ROLE.wanted(v) == {"cuda-drivers-550": "550.127.05-1"}
    facts = Facts("gpu01", values={
        "packages": {"cuda-drivers-550": installed("550.127.05-1", hold=False)},
        f"file:{DRIVER_PIN}": missing(DRIVER_PIN),
        "nvidia_module": "550.144.03",
    })
    pin = (f"# {header('driver')}\n\nPackage: cuda-drivers-550\nPin: version 550.127.05-1\n"
           "Pin-Priority: 1001\n")
    changes = plan(driver.ROLE, inv, facts)
    assert rows(changes) == [
        ("driver/hold cuda-drivers-550", "hold", "not held", "held"),
        (f"driver/file {DRIVER_PIN}", "create", "absent", f"{len(pin)} bytes"),
        ("driver/kernel module nvidia", "reboot", "550.144.03 (None)",
         "550.127.05 (proprietary)"),
    ]
    assert changes[1].steps[0].content == pin.encode()  # type: ignore[attr-defined]
    assert changes[2].steps[0].command == "systemctl reboot"  # type: ignore[attr-defined]


def test_driver_custom_blacklist(tmp_path: Path) -> None:
    inv = inventory(tmp_path, DRIVER_VARS + 'nvidia_driver_unattended_blacklist: "nvidia-, '
                    'linux-"\n')
    text = (f"// {header('driver')}\n"
            "// Keeps unattended-upgrades away from the pinned GPU stack.\n"
            'Unattended-Upgrade::Package-Blacklist {\n    "nvidia-";\n    "linux-";\n};\n')
    changes = plan(driver.ROLE, inv, driver_facts())
    assert rows(changes) == [(f"driver/file {UNATTENDED}", "update",
                              f"{len(UNATTENDED_TEXT)} bytes (differs)", f"{len(text)} bytes")]
    assert changes[0].steps[0].content == text.encode()  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", ["550", "550.abc", "r550.54", "550.54.", "latest"])
def test_driver_invalid_version(tmp_path: Path, version: str) -> None:
    inv = inventory(tmp_path, f'nvidia_driver_version: "{version}"\n')
    with pytest.raises(VarError) as caught:
        plan(driver.ROLE, inv, driver_facts())
    assert str(caught.value) == (f"host gpu01: nvidia_driver_version must look like 580.95.05, "
                                 f"got {version!r}")


def test_driver_version_of_wrong_type(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "nvidia_driver_version: [550]\n")
    with pytest.raises(VarError, match=r"^host gpu01: variable nvidia_driver_version must be a "
                                       r"string, got \[550\] \(.*/hosts\.yml:5\)$"):
        plan(driver.ROLE, inv, driver_facts())


# =========================================================================== cuda

CUDA_PIN = apt.pin_path("cuda")
CUDA_PIN_TEXT = (f"# {header('cuda')}\n\nPackage: cuda-toolkit-12-4\nPin: version 12.4.1-1\n"
                 "Pin-Priority: 1001\n")
CUDA_VARS = 'cuda_version: "12.4.1"\n'


def cuda_facts(link: str | None, alternative: str | None = None,
               package: str = "12.4.1-1", nvcc: str = "12.4.131") -> Facts:
    return Facts("gpu01", values={
        "packages": {"cuda-toolkit-12-4": installed(package)},
        f"file:{CUDA_PIN}": present(CUDA_PIN, CUDA_PIN_TEXT),
        "link:/usr/local/cuda": link,
        "link:/etc/alternatives/cuda": alternative,
        "nvcc": nvcc,
    })


def test_cuda_request(tmp_path: Path) -> None:
    v = RoleVars(inventory(tmp_path, CUDA_VARS).hosts["gpu01"], cuda.ROLE.defaults)
    assert cuda.ROLE.wanted(v) == {"cuda-toolkit-12-4": "12.4.1-1"}
    assert cuda.ROLE.request(v) == FactRequest(
        packages=frozenset({"cuda-toolkit-12-4"}), files=frozenset({CUDA_PIN}),
        links=frozenset({"/usr/local/cuda", "/etc/alternatives/cuda"}))


def test_cuda_converged_with_a_direct_link(tmp_path: Path) -> None:
    assert plan(cuda.ROLE, inventory(tmp_path, CUDA_VARS),
                cuda_facts("/usr/local/cuda-12.4")) == []


def test_cuda_link_missing(tmp_path: Path) -> None:
    changes = plan(cuda.ROLE, inventory(tmp_path, CUDA_VARS), cuda_facts(None))
    assert rows(changes) == [("cuda/link /usr/local/cuda", "link", "absent",
                              "/usr/local/cuda-12.4")]
    assert changes[0].steps[0].command == (  # type: ignore[attr-defined]
        "mkdir -p /usr/local && ln -sfn /usr/local/cuda-12.4 /usr/local/cuda.gpufleet-tmp && "
        "mv -Tf /usr/local/cuda.gpufleet-tmp /usr/local/cuda")


def test_cuda_link_to_another_version_and_upgrade(tmp_path: Path) -> None:
    changes = plan(cuda.ROLE, inventory(tmp_path, CUDA_VARS),
                   cuda_facts("/usr/local/cuda-12.6", package="12.4.0-1"))
    assert rows(changes) == [
        ("cuda/package cuda-toolkit-12-4", "upgrade", "12.4.0-1", "12.4.1-1"),
        ("cuda/link /usr/local/cuda", "link", "/usr/local/cuda-12.6", "/usr/local/cuda-12.4"),
    ]


def test_cuda_managed_by_update_alternatives(tmp_path: Path) -> None:
    changes = plan(cuda.ROLE, inventory(tmp_path, CUDA_VARS),
                   cuda_facts("/etc/alternatives/cuda", "/usr/local/cuda-12.6"))
    assert rows(changes) == [("cuda/alternative cuda (/usr/local/cuda)", "set",
                              "/usr/local/cuda-12.6", "/usr/local/cuda-12.4")]
    [step] = changes[0].steps
    assert isinstance(step, Run)
    assert step.command == "update-alternatives --set cuda /usr/local/cuda-12.4"


def test_cuda_alternative_absent_and_converged(tmp_path: Path) -> None:
    inv = inventory(tmp_path, CUDA_VARS)
    changes = plan(cuda.ROLE, inv, cuda_facts("/etc/alternatives/cuda", None))
    assert rows(changes) == [("cuda/alternative cuda (/usr/local/cuda)", "set", "absent",
                              "/usr/local/cuda-12.4")]
    assert plan(cuda.ROLE, inv, cuda_facts("/etc/alternatives/cuda",
                                           "/usr/local/cuda-12.4")) == []


def test_cuda_custom_home_and_link(tmp_path: Path) -> None:
    inv = inventory(tmp_path, 'cuda_version: "12.6.2"\ncuda_home: "/opt/cuda/{version}"\n'
                    "cuda_link: /opt/cuda/current\n")
    facts = Facts("gpu01", values={
        "packages": {"cuda-toolkit-12-6": installed("12.6.2-1")},
        f"file:{CUDA_PIN}": missing(CUDA_PIN),
        "link:/opt/cuda/current": "",
    })
    pin = (f"# {header('cuda')}\n\nPackage: cuda-toolkit-12-6\nPin: version 12.6.2-1\n"
           "Pin-Priority: 1001\n")
    changes = plan(cuda.ROLE, inv, facts)
    assert rows(changes) == [
        (f"cuda/file {CUDA_PIN}", "create", "absent", f"{len(pin)} bytes"),
        ("cuda/link /opt/cuda/current", "link", "not a link", "/opt/cuda/12.6.2"),
    ]
    assert changes[0].steps[0].content == pin.encode()  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", ["12", "12.x", "v12.4", "twelve"])
def test_cuda_invalid_version(tmp_path: Path, version: str) -> None:
    with pytest.raises(VarError) as caught:
        plan(cuda.ROLE, inventory(tmp_path, f'cuda_version: "{version}"\n'), cuda_facts(None))
    assert str(caught.value) == (f"host gpu01: cuda_version must be a CUDA release like 13.0.2 "
                                 f"(or 13.0), got {version!r}")


# =========================================================================== nccl

NCCL_PIN = apt.pin_path("nccl")


def nccl_wanted(tmp_path: Path, host_vars: str) -> dict[str, str]:
    v = RoleVars(inventory(tmp_path, host_vars).hosts["gpu01"], nccl.ROLE.defaults)
    return nccl.ROLE.wanted(v)


def test_nccl_version_from_nccl_cuda(tmp_path: Path) -> None:
    assert nccl_wanted(tmp_path, 'nccl_version: "2.21.5"\nnccl_cuda: "12.4"\n'
                       'cuda_version: "12.6.2"\n') == {
        "libnccl2": "2.21.5-1+cuda12.4", "libnccl-dev": "2.21.5-1+cuda12.4"}


def test_nccl_version_from_cuda_version(tmp_path: Path) -> None:
    assert nccl_wanted(tmp_path, 'nccl_version: "2.23.4"\ncuda_version: "12.6.2"\n') == {
        "libnccl2": "2.23.4-1+cuda12.6", "libnccl-dev": "2.23.4-1+cuda12.6"}


def test_nccl_custom_packages_and_format(tmp_path: Path) -> None:
    assert nccl_wanted(tmp_path, 'nccl_version: "2.21.5"\nnccl_cuda: "12.4"\n'
                       "nccl_packages: [libnccl2]\n"
                       'nccl_package_version: "{version}-2+cuda{cuda}"\n') == {
        "libnccl2": "2.21.5-2+cuda12.4"}


def test_nccl_without_any_cuda_version(tmp_path: Path) -> None:
    with pytest.raises(VarError) as caught:
        nccl_wanted(tmp_path, 'nccl_version: "2.21.5"\n')
    assert str(caught.value) == ("host gpu01: set nccl_cuda (e.g. 12.4) or cuda_version to build "
                                 "the NCCL package version")


def test_nccl_with_an_invalid_cuda_version(tmp_path: Path) -> None:
    with pytest.raises(VarError, match=r"^host gpu01: cuda_version must be a CUDA release like "
                                       r"13\.0\.2 \(or 13\.0\), got '12'$"):
        nccl_wanted(tmp_path, 'nccl_version: "2.21.5"\ncuda_version: "12"\n')


def test_nccl_plan_downgrade_and_install_share_one_transaction(tmp_path: Path) -> None:
    inv = inventory(tmp_path, 'nccl_version: "2.21.5"\ncuda_version: "12.4.1"\n')
    facts = Facts("gpu01", values={
        "packages": {"libnccl2": installed("2.23.4-1+cuda12.6")},
        f"file:{NCCL_PIN}": missing(NCCL_PIN),
    })
    pin = (f"# {header('nccl')}\n\n"
           "Package: libnccl2\nPin: version 2.21.5-1+cuda12.4\nPin-Priority: 1001\n\n"
           "Package: libnccl-dev\nPin: version 2.21.5-1+cuda12.4\nPin-Priority: 1001\n")
    changes = plan(nccl.ROLE, inv, facts)
    assert rows(changes) == [
        ("nccl/package libnccl2", "downgrade", "2.23.4-1+cuda12.6", "2.21.5-1+cuda12.4"),
        ("nccl/package libnccl-dev", "install", "not installed", "2.21.5-1+cuda12.4"),
        (f"nccl/file {NCCL_PIN}", "create", "absent", f"{len(pin)} bytes"),
    ]
    assert changes[2].steps[0].content == pin.encode()  # type: ignore[attr-defined]
    assert changes[0].steps == changes[1].steps
    assert changes[0].steps[0].packages == {  # type: ignore[attr-defined]
        "libnccl2": "2.21.5-1+cuda12.4", "libnccl-dev": "2.21.5-1+cuda12.4"}


def test_nccl_converged(tmp_path: Path) -> None:
    inv = inventory(tmp_path, 'nccl_version: "2.21.5"\nnccl_cuda: "12.4"\n')
    wanted = {"libnccl2": "2.21.5-1+cuda12.4", "libnccl-dev": "2.21.5-1+cuda12.4"}
    facts = Facts("gpu01", values={
        "packages": {name: installed(version) for name, version in wanted.items()},
        f"file:{NCCL_PIN}": present(NCCL_PIN, apt.pin_content("nccl", wanted)),
    })
    assert plan(nccl.ROLE, inv, facts) == []


# =========================================================================== pytorch

VENV_PY = "/opt/gpufleet/venv/bin/python"


@pytest.mark.parametrize(("reported", "wanted", "expected"), [
    ("2.13.0+cpu", "2.13.0", True),
    ("2.13.0+cu124", "2.13.0", True),
    ("2.13.0", "2.13.0", True),
    ("2.13.0+cpu", "2.13.0+cpu", True),
    ("2.13.0+cpu", "2.13.0+cu124", False),
    ("2.13.0", "2.13.0+cpu", False),
    ("2.13.1+cpu", "2.13.0", False),
    ("2.13.0a0+git1234", "2.13.0", False),
    (None, "2.13.0", False),
])
def test_version_matches(reported: str | None, wanted: str, expected: bool) -> None:
    assert pytorch.version_matches(reported, wanted) is expected


@pytest.mark.parametrize(("reported", "wanted", "expected"), [
    (None, None, True),
    ("12.4", None, True),
    (None, "none", True),
    (None, "CPU", True),
    ("12.4", "none", False),
    ("12.4", "12.4", True),
    ("12.6", "12.4", False),
    (None, "12.4", False),
])
def test_cuda_matches(reported: str | None, wanted: str | None, expected: bool) -> None:
    assert pytorch.cuda_matches(reported, wanted) is expected


def test_verify_lists_every_problem() -> None:
    info = {"torch": "2.12.0+cu124", "cuda": "12.4", "nccl": "2.21.5"}
    assert pytorch.verify(info, "2.13.0", "none", "2.23.4") == [
        "torch reports version 2.12.0+cu124, inventory wants 2.13.0",
        "torch reports CUDA 12.4, inventory wants none",
        "torch bundles NCCL 2.21.5, inventory wants 2.23.4",
    ]
    assert pytorch.verify({"torch": "2.13.0+cpu", "cuda": None}, "2.13.0", "none", None) == []


def torch_facts(info: dict[str, Any] | None, reason: str = "") -> Facts:
    key = f"torch:{VENV_PY}"
    if info is None:
        return Facts("gpu01", absent={key: reason})
    return Facts("gpu01", values={key: info})


PYTORCH_VARS = 'pytorch_version: "2.13.0"\npytorch_cuda: none\n'


def pip_args(change: Change) -> list[str]:
    [step] = change.steps
    assert isinstance(step, pytorch.PipInstall)
    assert step.python == VENV_PY
    return step.args


def test_pytorch_request(tmp_path: Path) -> None:
    v = RoleVars(inventory(tmp_path, PYTORCH_VARS + "pytorch_venv: /srv/venv/\n").hosts["gpu01"],
                 pytorch.ROLE.defaults)
    assert pytorch.ROLE.request(v) == FactRequest(pythons=frozenset({"/srv/venv/bin/python"}))


def test_pytorch_converged_cpu_build(tmp_path: Path) -> None:
    facts = torch_facts({"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": None, "nccl": None})
    assert plan(pytorch.ROLE, inventory(tmp_path, PYTORCH_VARS), facts) == []


def test_pytorch_venv_missing_creates_it_then_installs(tmp_path: Path) -> None:
    inv = inventory(tmp_path, PYTORCH_VARS + "pytorch_python: python3.11\n")
    changes = plan(pytorch.ROLE, inv, torch_facts(None, f"no python at {VENV_PY}"))
    assert rows(changes) == [
        ("pytorch/venv /opt/gpufleet/venv", "create", "absent", "python3.11"),
        ("pytorch/torch", "install", "not installed", "{torch: 2.13.0, cuda: none}"),
    ]
    [venv] = changes[0].steps
    assert isinstance(venv, Run)
    assert venv.command == "python3.11 -m venv /opt/gpufleet/venv"
    assert pip_args(changes[1]) == ["torch==2.13.0"]
    step = changes[1].steps[0]
    assert (step.version, step.cuda, step.nccl, step.timeout) == (  # type: ignore[attr-defined]
        "2.13.0", "none", None, 3600.0)


def test_pytorch_torch_missing_in_an_existing_venv(tmp_path: Path) -> None:
    changes = plan(pytorch.ROLE, inventory(tmp_path, PYTORCH_VARS),
                   torch_facts(None, "ModuleNotFoundError: No module named 'torch'"))
    assert rows(changes) == [
        ("pytorch/torch", "install", "not installed", "{torch: 2.13.0, cuda: none}")]


def test_pytorch_version_matches_but_cuda_differs_reinstalls_with_force(tmp_path: Path) -> None:
    inv = inventory(tmp_path, 'pytorch_version: "2.13.0"\npytorch_cuda: "12.4"\n'
                    "pytorch_index_url: https://download.pytorch.org/whl/cu124\n")
    facts = torch_facts({"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": None, "nccl": None})
    changes = plan(pytorch.ROLE, inv, facts)
    assert rows(changes) == [
        ("pytorch/torch", "reinstall", "{torch: 2.13.0+cpu}", "{torch: 2.13.0, cuda: 12.4}")]
    assert pip_args(changes[0]) == ["--index-url", "https://download.pytorch.org/whl/cu124",
                                    "--force-reinstall", "torch==2.13.0"]


def test_pytorch_other_version_installs_without_force(tmp_path: Path) -> None:
    inv = inventory(tmp_path, PYTORCH_VARS + "pytorch_nccl: 2.21.5\n"
                    "pytorch_extra_index_url: https://mirror.example/simple\n"
                    "pytorch_find_links: /srv/wheels\npytorch_no_index: true\n"
                    "pytorch_constraints: /srv/constraints.txt\npytorch_pip_timeout: 600\n")
    facts = torch_facts({"torch": "2.12.0+cu124", "cuda": "12.4", "nccl": "2.21.5"})
    changes = plan(pytorch.ROLE, inv, facts)
    assert rows(changes) == [
        ("pytorch/torch", "install", "{torch: 2.12.0+cu124, cuda: 12.4, nccl: 2.21.5}",
         "{torch: 2.13.0, cuda: none, nccl: 2.21.5}")]
    assert pip_args(changes[0]) == [
        "--extra-index-url", "https://mirror.example/simple", "--find-links", "/srv/wheels",
        "--constraint", "/srv/constraints.txt", "--no-index", "torch==2.13.0"]
    assert changes[0].steps[0].timeout == 600.0  # type: ignore[attr-defined]


def test_pytorch_without_cuda_pin_accepts_any_build(tmp_path: Path) -> None:
    inv = inventory(tmp_path, 'pytorch_version: "2.13.0"\n')
    facts = torch_facts({"torch": "2.13.0+cu124", "cuda": "12.4", "nccl": "2.21.5"})
    assert plan(pytorch.ROLE, inv, facts) == []


# =========================================================================== nccl_env

CONF, ENV, PROFILE, SYSCTL = ("/etc/nccl.conf", "/etc/default/gpufleet-nccl",
                              "/etc/profile.d/gpufleet-nccl.sh",
                              "/etc/sysctl.d/60-gpufleet-nccl.conf")
PORT_KEY = "net.ipv4.ip_local_port_range"
NCCL_ENV_VARS = """\
nccl_env:
  NCCL_SOCKET_IFNAME: "^docker,lo"
  NCCL_IB_DISABLE: 1
  NCCL_NVLS_ENABLE: false
"""
# rendered sorted by name, whatever the inventory's order
NCCL_CONF_TEXT = (f"# {header('nccl_env')}\nNCCL_IB_DISABLE=1\nNCCL_NVLS_ENABLE=false\n"
                  "NCCL_SOCKET_IFNAME=^docker,lo\n")
ENV_TEXT = (f"# {header('nccl_env')}\n"
            "# NCCL and Gloo settings for launchers (systemd EnvironmentFile, torchrun wrappers).\n"
            "GLOO_SOCKET_IFNAME='^docker,lo'\nNCCL_IB_DISABLE=1\nNCCL_NVLS_ENABLE=false\n"
            "NCCL_SOCKET_IFNAME='^docker,lo'\n")
PROFILE_TEXT = (f"# {header('nccl_env')}\n"
                "# Exports the NCCL and Gloo settings of /etc/default/gpufleet-nccl into login "
                "shells.\nif [ -r /etc/default/gpufleet-nccl ]; then\n    set -a\n"
                "    . /etc/default/gpufleet-nccl\n    set +a\nfi\n")
SYSCTL_TEXT = (f"# {header('nccl_env')}\n"
               "# NCCL's ephemeral ports must fall inside the range the firewall opens.\n"
               "net.ipv4.ip_local_port_range = 49152 65535\n")


def env_facts(live: str = "49152 65535", **overrides: FileState) -> Facts:
    files = {CONF: present(CONF, NCCL_CONF_TEXT), ENV: present(ENV, ENV_TEXT),
             PROFILE: present(PROFILE, PROFILE_TEXT), SYSCTL: present(SYSCTL, SYSCTL_TEXT)}
    files.update({f.path: f for f in overrides.values()})
    values: dict[str, Any] = {f"file:{p}": f for p, f in files.items()}
    values[f"sysctl:{PORT_KEY}"] = live
    return Facts("gpu01", values=values)


def env_vars(tmp_path: Path, extra: str = "") -> RoleVars:
    inv = inventory(tmp_path, NCCL_ENV_VARS + extra)
    return RoleVars(inv.hosts["gpu01"], nccl_env.ROLE.defaults)


def test_nccl_env_converged(tmp_path: Path) -> None:
    assert plan(nccl_env.ROLE, inventory(tmp_path, NCCL_ENV_VARS), env_facts()) == []


def test_nccl_env_request(tmp_path: Path) -> None:
    v = env_vars(tmp_path)
    assert nccl_env.ROLE.active(v)
    assert nccl_env.ROLE.request(v) == FactRequest(files=frozenset({CONF, ENV, PROFILE, SYSCTL}),
                                                   sysctls=frozenset({PORT_KEY}))


def test_nccl_env_fresh_host(tmp_path: Path) -> None:
    facts = env_facts("32768\t60999", conf=missing(CONF), env=missing(ENV),
                      profile=missing(PROFILE), sysctl=missing(SYSCTL))
    changes = plan(nccl_env.ROLE, inventory(tmp_path, NCCL_ENV_VARS), facts)
    assert rows(changes) == [
        (f"nccl_env/file {CONF}", "create", "absent", f"{len(NCCL_CONF_TEXT)} bytes"),
        (f"nccl_env/file {ENV}", "create", "absent", f"{len(ENV_TEXT)} bytes"),
        (f"nccl_env/file {PROFILE}", "create", "absent", f"{len(PROFILE_TEXT)} bytes"),
        (f"nccl_env/file {SYSCTL}", "create", "absent", f"{len(SYSCTL_TEXT)} bytes"),
        (f"nccl_env/sysctl {PORT_KEY}", "set", "32768\t60999", "49152 65535"),
    ]
    contents = [c.steps[0].content.decode() for c in changes[:4]]  # type: ignore[attr-defined]
    assert contents == [NCCL_CONF_TEXT, ENV_TEXT, PROFILE_TEXT, SYSCTL_TEXT]
    [sysctl] = changes[4].steps
    assert isinstance(sysctl, Run)
    assert sysctl.command == "sysctl -q -w net.ipv4.ip_local_port_range='49152 65535'"


def test_nccl_env_files_do_not_depend_on_the_order_of_the_source(tmp_path: Path) -> None:
    """The vault route: ``ansible-inventory --list`` JSON has its mapping keys sorted, a YAML
    inventory keeps its own order; both render the same files, so neither is drift."""
    listing = tmp_path / "listing.json"
    listing.write_text(json.dumps({
        "_meta": {"hostvars": {"gpu01": {"nccl_env": {
            "NCCL_IB_DISABLE": 1, "NCCL_NVLS_ENABLE": False,
            "NCCL_SOCKET_IFNAME": "^docker,lo"}}}},
        "all": {"children": ["ungrouped"]}, "ungrouped": {"hosts": ["gpu01"]}}, sort_keys=True))
    from_json = load_inventory(listing)
    (tmp_path / "yaml").mkdir()
    from_yaml = inventory(tmp_path / "yaml", NCCL_ENV_VARS)
    facts = env_facts(conf=missing(CONF), env=missing(ENV))

    def rendered(inv: Inventory) -> list[str]:
        changes = plan(nccl_env.ROLE, inv, facts)
        return [c.steps[0].content.decode() for c in changes[:2]]  # type: ignore[attr-defined]

    assert rendered(from_json) == rendered(from_yaml) == [NCCL_CONF_TEXT, ENV_TEXT]
    assert plan(nccl_env.ROLE, from_json, env_facts()) == []


def test_nccl_env_sysctl_only_when_live_value_differs(tmp_path: Path) -> None:
    changes = plan(nccl_env.ROLE, inventory(tmp_path, NCCL_ENV_VARS), env_facts("32768 60999"))
    assert rows(changes) == [(f"nccl_env/sysctl {PORT_KEY}", "set", "32768 60999",
                              "49152 65535")]


def test_nccl_env_settings_exact(tmp_path: Path) -> None:
    assert nccl_env.ROLE.settings(env_vars(tmp_path)) == {
        "NCCL_SOCKET_IFNAME": "^docker,lo", "NCCL_IB_DISABLE": "1", "NCCL_NVLS_ENABLE": "false"}


@pytest.mark.parametrize(("extra", "message"), [
    ("  nccl_debug: INFO\n",
     "host gpu01: nccl_env key 'nccl_debug' is not a valid environment variable name"),
    ("  1NCCL: x\n", "host gpu01: nccl_env key '1NCCL' is not a valid environment variable name"),
    ('  NCCL-DEBUG: INFO\n',
     "host gpu01: nccl_env key 'NCCL-DEBUG' is not a valid environment variable name"),
    ('  NCCL_DEBUG: "INFO\\nNCCL_X=1"\n', "host gpu01: nccl_env NCCL_DEBUG contains a line break"),
])
def test_nccl_env_invalid_settings(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(VarError) as caught:
        plan(nccl_env.ROLE, inventory(tmp_path, NCCL_ENV_VARS + extra), env_facts())
    assert str(caught.value) == message


def test_nccl_env_must_be_a_mapping(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "nccl_env: [NCCL_DEBUG]\n")
    with pytest.raises(VarError, match=r"^host gpu01: variable nccl_env must be a mapping, "
                                       r"got \['NCCL_DEBUG'\] \(.*hosts\.yml:5\)$"):
        plan(nccl_env.ROLE, inv, env_facts())


@pytest.mark.parametrize(("extra", "expected"), [
    ("", "49152 65535"),
    ("firewall_port_range: 50000-51000\n", "50000 51000"),
    ("nccl_local_port_range: 50000-60000\n", "50000 60000"),
    ('nccl_local_port_range: "50000 60000"\n', "50000 60000"),
    ("nccl_local_port_range: \"50000:60000\"\nfirewall_port_range: 40000-65535\n",
     "50000 60000"),
    ("nccl_local_port_range: 49152-65535\n", "49152 65535"),
])
def test_nccl_env_port_range(tmp_path: Path, extra: str, expected: str) -> None:
    assert nccl_env.ROLE.port_range(env_vars(tmp_path, extra)) == expected


@pytest.mark.parametrize(("extra", "message"), [
    ("nccl_local_port_range: 40000-50000\n",
     "host gpu01: nccl_local_port_range 40000-50000 lies outside firewall_port_range "
     "49152-65535; NCCL would pick ports the firewall closes"),
    ("nccl_local_port_range: 50000-60000\nfirewall_port_range: 52000-65535\n",
     "host gpu01: nccl_local_port_range 50000-60000 lies outside firewall_port_range "
     "52000-65535; NCCL would pick ports the firewall closes"),
    ("nccl_local_port_range: 60000-50000\n",
     "host gpu01: nccl_local_port_range '60000-50000' is not a valid port range"),
    ("nccl_local_port_range: lots\n",
     "host gpu01: nccl_local_port_range must be a port range like 49152-65535, got 'lots'"),
    ("firewall_port_range: 49152-70000\n",
     "host gpu01: firewall_port_range '49152-70000' is not a valid port range"),
    ("firewall_port_range: 1-2-3\n",
     "host gpu01: firewall_port_range must be a port range like 49152-65535, got '1-2-3'"),
])
def test_nccl_env_port_range_errors(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(VarError) as caught:
        nccl_env.ROLE.port_range(env_vars(tmp_path, extra))
    assert str(caught.value) == message


def test_nccl_env_gloo_ifname_explicit_wins(tmp_path: Path) -> None:
    inv = inventory(tmp_path, NCCL_ENV_VARS + "gloo_socket_ifname: eth0\n")
    changes = plan(nccl_env.ROLE, inv, env_facts())
    assert rows(changes) == [(f"nccl_env/file {ENV}", "update",
                              f"{len(ENV_TEXT)} bytes (differs)", f"{len(ENV_TEXT) - 8} bytes")]
    assert changes[0].diff == (
        f"--- {ENV} (on host)\n+++ {ENV} (desired)\n@@ -1,6 +1,6 @@\n"
        f" # {header('nccl_env')}\n"
        " # NCCL and Gloo settings for launchers (systemd EnvironmentFile, torchrun wrappers).\n"
        "-GLOO_SOCKET_IFNAME='^docker,lo'\n"
        "+GLOO_SOCKET_IFNAME=eth0\n"
        " NCCL_IB_DISABLE=1\n NCCL_NVLS_ENABLE=false\n NCCL_SOCKET_IFNAME='^docker,lo'\n")


def test_nccl_env_without_socket_ifname_has_no_gloo_line(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "nccl_env:\n  NCCL_DEBUG: WARN\n")
    facts = env_facts(conf=missing(CONF), env=missing(ENV))
    changes = plan(nccl_env.ROLE, inv, facts)
    assert [c.action for c in changes] == ["create", "create"]
    assert changes[1].steps[0].content.decode() == (  # type: ignore[attr-defined]
        f"# {header('nccl_env')}\n"
        "# NCCL and Gloo settings for launchers (systemd EnvironmentFile, torchrun wrappers).\n"
        "NCCL_DEBUG=WARN\n")


def test_nccl_env_null_value_is_not_written_as_none(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "nccl_env:\n  NCCL_SOCKET_IFNAME: eth0\n  NCCL_DEBUG:\n")
    facts = env_facts(conf=missing(CONF), env=missing(ENV))
    try:
        changes = plan(nccl_env.ROLE, inv, facts)
    except VarError:
        return
    contents = [c.steps[0].content.decode() for c in changes  # type: ignore[attr-defined]
                if c.action == "create"]
    assert len(contents) == 2
    assert not any("NCCL_DEBUG=None" in text for text in contents)


def test_nccl_env_empty_mapping_is_active(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "nccl_env: {}\n")
    v = RoleVars(inv.hosts["gpu01"], nccl_env.ROLE.defaults)
    assert nccl_env.ROLE.active(v)
    assert not nccl_env.ROLE.active(RoleVars(inventory(tmp_path).hosts["gpu01"],
                                             nccl_env.ROLE.defaults))


# =========================================================================== engine and vars


def test_plan_host_orders_reboots_last_and_unions_requests(tmp_path: Path) -> None:
    inv = inventory(tmp_path, DRIVER_VARS + CUDA_VARS)
    host = inv.hosts["gpu01"]
    pairs = active_roles(host, select("driver,cuda"))
    assert [role.name for role, _ in pairs] == ["driver", "cuda"]
    assert fact_request(pairs) == FactRequest(
        packages=frozenset({"nvidia-driver-550", "cuda-toolkit-12-4"}),
        files=frozenset({DRIVER_PIN, UNATTENDED, CUDA_PIN}),
        links=frozenset({"/usr/local/cuda", "/etc/alternatives/cuda"}),
        custom=frozenset({driver.MODULE_FLAVOR, driver.SECURE_BOOT, driver.GPU_OPERATOR}))
    facts = driver_facts(module=None)
    facts.values["packages"]["cuda-toolkit-12-4"] = installed("12.4.1-1")
    facts.values[f"file:{CUDA_PIN}"] = present(CUDA_PIN, CUDA_PIN_TEXT)
    facts.values["link:/usr/local/cuda"] = None
    result = plan_host(inv, host, pairs, facts)
    assert result.host == "gpu01"
    assert [c.item for c in result.changes] == ["cuda/link /usr/local/cuda",
                                                "driver/kernel module nvidia"]
    assert result.reboot_required


@pytest.mark.parametrize(("value", "expected"), [
    ("yes", True), ("On", True), ("1", True), (True, True), (1, True),
    ("no", False), ("off", False), ("", False), (False, False), (0, False),
])
def test_role_vars_boolean(tmp_path: Path, value: object, expected: bool) -> None:
    host = inventory(tmp_path).hosts["gpu01"]
    host.vars["flag"] = value
    assert RoleVars(host, {}).boolean("flag") is expected


def test_role_vars_accessors_and_errors(tmp_path: Path) -> None:
    host = inventory(tmp_path).hosts["gpu01"]
    host.vars.update({"flag": "maybe", "n": "12", "bad_n": True, "csv": " a, b ,,c ",
                      "lst": ["x"], "num": 12.5, "m": "not a mapping"})
    v = RoleVars(host, {"default_only": "d", "n": 1})
    assert (v.integer("n"), v.string("num"), v.string("default_only")) == (12, "12.5", "d")
    assert v.items("csv") == ["a", "b", "c"]
    assert v.items("lst") == ["x"]
    assert v.items("unset") == []
    assert v.mapping("unset") == {}
    assert v.opt_string("unset") is None
    assert "default_only" in v
    assert "unset" not in v
    with pytest.raises(VarError, match=r"^host gpu01: variable flag must be a boolean, "
                                       r"got 'maybe'$"):
        v.boolean("flag")
    with pytest.raises(VarError, match=r"^host gpu01: variable bad_n must be an integer, "
                                       r"got True$"):
        v.integer("bad_n")
    with pytest.raises(VarError, match=r"^host gpu01: variable m must be a mapping"):
        v.mapping("m")
    with pytest.raises(VarError, match=r"^host gpu01: variable num must be a list, got 12\.5$"):
        v.items("num")
