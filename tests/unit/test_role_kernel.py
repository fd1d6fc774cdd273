"""The kernel role's plans from hand-built facts: the pinned release installed, held and
pinned and kept from unattended-upgrades; the next boot's kernel; the modules the node's
roles need built for the kernel it keeps; the reboot into it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import VarError
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import Facts
from gpufleet.inventory.model import Inventory
from gpufleet.provision import apt
from gpufleet.provision.plan import ApplyContext, ApplyOptions, Change, Fail, Run
from gpufleet.provision.reboot import Reboot
from gpufleet.provision.role import RoleVars
from gpufleet.roles import driver
from gpufleet.roles.kernel import ROLE, UNATTENDED_PATH, module_problem, newest
from tests.unit.test_roles_plan import header, installed, inventory, plan, rows

K27, K28 = "6.1.0-27-amd64", "6.1.0-28-amd64"
PIN = f'kernel_version: "{K27}"\nnvidia_driver_version: "550.127.05"\n'


def built(release: str, version: str = "550.127.05") -> dict[str, str]:
    return {"filename": f"/lib/modules/{release}/updates/dkms/nvidia.ko", "version": version,
            "vermagic": f"{release} SMP preempt mod_unload modversions", "name": "nvidia"}


NOT_FOUND = {"error": "modinfo: ERROR: Module nvidia not found."}


def state(running: str, boot: list[str], headers: list[str],
          modules: dict[str, dict[str, Any]], dkms: bool = True) -> dict[str, Any]:
    return {"running": running, "boot": boot, "headers": headers, "modules": modules,
            "dkms": {"modules": [], "notes": []} if dkms else None}


def both_built(release: str) -> dict[str, Any]:
    return {"nvidia": built(release), "nvidia-uvm": built(release)}


def blacklist() -> str:
    return (f"// {header('kernel')}\n// Keeps unattended-upgrades away from the pinned kernel.\n"
            'Unattended-Upgrade::Package-Blacklist {\n    "linux-image-";\n'
            '    "linux-headers-";\n    "linux-modules-";\n};\n')


WANTED = {f"linux-image-{K27}": "*", f"linux-headers-{K27}": "*"}


def converged_files(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    pin = apt.pin_path("kernel")
    return {"packages": {name: installed("6.1.115-1") for name in WANTED},
            f"file:{pin}": FileState(pin, True, apt.pin_content("kernel", WANTED).encode(),
                                     "644", "root:root"),
            f"file:{UNATTENDED_PATH}": FileState(UNATTENDED_PATH, True, blacklist().encode(),
                                                 "644", "root:root"),
            **(extra or {})}


def facts(kernel_state: dict[str, Any], **values: Any) -> Facts:
    return Facts("gpu01", values={"kernel_state": kernel_state,
                                  "kernel": kernel_state["running"], **values})


def test_a_converged_pinned_kernel_plans_nothing(tmp_path: Path) -> None:
    inv = inventory(tmp_path, PIN)
    done = facts(state(K27, [K27], [K27], {K27: both_built(K27)}), **converged_files())
    assert plan(ROLE, inv, done) == []


def test_a_fresh_node_installs_the_pinned_kernel_builds_the_modules_and_reboots(
        tmp_path: Path) -> None:
    """Its headers come with it, so DKMS can build the driver for it; the node then boots
    it (the newest installed)."""
    inv = inventory(tmp_path, PIN)
    fresh = facts(state("6.1.0-26-amd64", ["6.1.0-26-amd64"], ["6.1.0-26-amd64"],
                        {"6.1.0-26-amd64": both_built("6.1.0-26-amd64")}),
                  packages={}, **{f"file:{apt.pin_path('kernel')}": FileState("p", False),
                                  f"file:{UNATTENDED_PATH}": FileState("u", False)})
    changes = plan(ROLE, inv, fresh)
    assert rows(changes) == [
        (f"kernel/package linux-image-{K27}", "install", "not installed", "*"),
        (f"kernel/package linux-headers-{K27}", "install", "not installed", "*"),
        ("kernel/file /etc/apt/preferences.d/gpufleet-kernel.pref", "create", "absent",
         f"{len(apt.pin_content('kernel', WANTED))} bytes"),
        (f"kernel/file {UNATTENDED_PATH}", "create", "absent", f"{len(blacklist())} bytes"),
        (f"kernel/module nvidia ({K27})", "build",
         "not built (the kernel is not installed yet)", f"built for {K27}"),
        (f"kernel/module nvidia-uvm ({K27})", "build",
         "not built (the kernel is not installed yet)", f"built for {K27}"),
        ("kernel/kernel running", "reboot", "6.1.0-26-amd64", f"{K27} (next boot)"),
    ]
    build = changes[4].steps[0]
    assert changes[5].steps == [build] and isinstance(build, Run)
    assert build.command.startswith(f"dkms autoinstall -k {K27}; modinfo -k {K27} nvidia ")
    reboot = changes[-1]
    assert reboot.pending_reboot and reboot.kind == "reboot"
    assert isinstance(reboot.steps[0], Reboot)


def test_a_kernel_upgrade_installed_without_headers_is_named_with_its_modules(
        tmp_path: Path) -> None:
    """A routine upgrade took a newer image and no headers: the next boot runs it, not the
    pin, and without the driver; neither can provisioning fix alone."""
    inv = inventory(tmp_path, PIN)
    upgraded = facts(state(K27, [K27, K28], [K27], {K27: both_built(K27),
                                                  K28: {"nvidia": NOT_FOUND,
                                                        "nvidia-uvm": NOT_FOUND}}),
                     **converged_files())
    changes = plan(ROLE, inv, upgraded)
    assert rows(changes) == [
        ("kernel/kernel next boot", "verify", f"{K28} (the newest installed)", K27),
        (f"kernel/module nvidia ({K28})", "build",
         "not built (modinfo: ERROR: Module nvidia not found.)", f"built for {K28}"),
        (f"kernel/module nvidia-uvm ({K28})", "build",
         "not built (modinfo: ERROR: Module nvidia not found.)", f"built for {K28}"),
    ]
    assert [type(c.steps[0]) for c in changes] == [Fail, Fail, Fail]
    assert str(changes[1].steps[0].message) == (  # type: ignore[attr-defined]
        f"nvidia, nvidia-uvm not built for kernel {K28}: its headers are not installed "
        f"(linux-headers-{K28}), so DKMS cannot build them")


def test_without_a_pin_the_next_boot_is_a_reboot_and_its_modules_are_checked(
        tmp_path: Path) -> None:
    inv = inventory(tmp_path, 'kernel_check: true\nnvidia_driver_version: "550.127.05"\n')
    ready = facts(state(K27, [K27, K28], [K27, K28], {K28: both_built(K28)}))
    assert rows(plan(ROLE, inv, ready)) == [
        ("kernel/kernel running", "reboot", K27, f"{K28} (next boot)")]
    missing = facts(state(K27, [K27, K28], [K27, K28],
                          {K28: {"nvidia": built(K27), "nvidia-uvm": built(K28)}},
                          dkms=False))
    changes = plan(ROLE, inv, missing)
    assert rows(changes)[0] == (f"kernel/module nvidia ({K28})", "build",
                                f"built for {K27} (/lib/modules/{K27}/updates/dkms/nvidia.ko)",
                                f"built for {K28}")
    assert "dkms is not installed" in changes[0].steps[0].message  # type: ignore[attr-defined]


@pytest.mark.parametrize(("variables", "modules"), [
    ('nvidia_driver_version: "580.95.05"\n', ("nvidia", "nvidia-uvm")),
    ('nvidia_driver_version: "580.95.05"\nnvidia_driver_install: operator\n', ()),
    ('nvidia_driver_version: "580.95.05"\ngpudirect_rdma: true\nofed_version: "24.10-1.1.4.0"\n',
     ("nvidia", "nvidia-uvm", "nvidia-peermem", "mlx5_core", "mlx5_ib", "ib_core")),
    ('nvidia_driver_version: "580.95.05"\nkernel_modules: [nvidia, gdrdrv]\n',
     ("nvidia", "gdrdrv")),
    ("kernel_modules: []\n", ()),
])
def test_the_modules_are_the_roles_unless_named(tmp_path: Path, variables: str,
                                                modules: tuple[str, ...]) -> None:
    inv = inventory(tmp_path, "kernel_check: true\n" + variables)
    assert ROLE.modules(RoleVars(inv.hosts["gpu01"], ROLE.defaults)) == modules


def test_ofeds_module_must_not_be_the_kernels_own() -> None:
    own = {"filename": f"/lib/modules/{K27}/kernel/drivers/net/ethernet/mellanox/mlx5/core/"
                       "mlx5_core.ko", "vermagic": f"{K27} SMP mod_unload modversions"}
    assert module_problem(own, "mlx5_core", K27) == (
        f"only the kernel's own ({own['filename']}): OFED's is not built for it")
    ofed = {**own, "filename": f"/lib/modules/{K27}/updates/dkms/mlx5_core.ko"}
    assert module_problem(ofed, "mlx5_core", K27) is None
    assert module_problem({"filename": "/x.ko"}, "nvidia", K27) == "no vermagic (/x.ko)"


def test_the_next_boot_is_the_newest_release_as_dpkg_orders_versions() -> None:
    assert newest({"6.8.0-45-generic", "6.8.0-100-generic", "6.8.0-9-generic"}) == \
        "6.8.0-100-generic"
    assert newest(set()) is None


@pytest.mark.parametrize(("variables", "message"), [
    ('kernel_version: "6.8.0-45-generic; reboot"\n', "kernel_version must be a kernel release"),
    ('kernel_version: "6.8.0-45-generic"\nkernel_modules: ["nvidia; rm"]\n',
     "kernel_modules must be a list of module names"),
    ('kernel_version: "6.8.0-45-generic"\nkernel_unattended_blacklist: ["linux-\\"; x"]\n',
     "is not a package name prefix"),
    ('kernel_check: true\nofed_version: "24.10 x"\n', "ofed_version must be a version"),
])
def test_bad_values_are_refused(tmp_path: Path, variables: str, message: str) -> None:
    inv = inventory(tmp_path, variables)
    with pytest.raises(VarError, match=message):
        ROLE.check(RoleVars(inv.hosts["gpu01"], ROLE.defaults))


def test_the_driver_and_the_kernel_reboot_a_host_once(tmp_path: Path) -> None:
    """Two roles asking for a reboot in one run: the host reboots once; without --reboot
    the pending reason names both."""
    inv: Inventory = inventory(tmp_path, PIN)
    driver = Reboot("reboot", "loaded kernel module 550.127.05, driver package 565.57.01")
    kernel = Reboot("reboot", f"running kernel 6.1.0-26-amd64, next boot {K27}")
    ctx = ApplyContext(conn=None, host=inv.hosts["gpu01"],  # type: ignore[arg-type]
                       options=ApplyOptions(reboot=False))
    driver.apply(ctx)
    kernel.apply(ctx)
    assert ctx.memo["reboot_pending"] == f"{driver.reason}; {kernel.reason}"
    ctx = ApplyContext(conn=None, host=inv.hosts["gpu01"],  # type: ignore[arg-type]
                       options=ApplyOptions(reboot=True), memo={"rebooted": True})
    kernel.apply(ctx)
    assert ctx.log == [f"reboot ({kernel.reason}): done by this run's reboot"]


def test_the_blacklist_keeps_the_drivers_own_wording(tmp_path: Path) -> None:
    """The template both roles render says what each keeps from unattended-upgrades; the
    driver's file is unchanged by the kernel's."""
    inv = inventory(tmp_path, 'nvidia_driver_version: "550.127.05"\n')
    changes: list[Change] = plan(driver.ROLE, inv, Facts("gpu01", values={
        "packages": {}, f"file:{driver.UNATTENDED_PATH}": FileState("x", False),
        f"file:{apt.pin_path('driver')}": FileState("y", False)}))
    written = next(c for c in changes if c.resource == f"file {driver.UNATTENDED_PATH}")
    assert "away from the pinned GPU stack." in (written.diff or "")
