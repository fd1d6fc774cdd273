"""The plan model: shared steps run once and in order; a failing step says what was applied."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpufleet.connect.connection import CommandFailed, Unreachable
from gpufleet.connect.local import LocalConnection
from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host
from gpufleet.provision.plan import (
    ApplyContext,
    ApplyOptions,
    Change,
    HostLost,
    Plan,
    Put,
    Run,
    StepFailed,
    apply_plan,
)


@dataclass(eq=False)
class Mark:
    """A step that records that it ran, and optionally fails."""

    name: str
    calls: list[str]
    error: Exception | None = None

    def describe(self) -> str:
        return f"mark {self.name}"

    def apply(self, ctx: ApplyContext) -> None:
        self.calls.append(self.name)
        if self.error is not None:
            raise self.error


@dataclass
class Calls:
    names: list[str] = field(default_factory=list)

    def step(self, name: str, error: Exception | None = None) -> Mark:
        return Mark(name, self.names, error)


def host() -> Host:
    return Host("local", {"ansible_connection": "local"}, frozenset({"all"}))


def context() -> ApplyContext:
    h = host()
    return ApplyContext(LocalConnection(h), h, ApplyOptions())


def test_plan_steps_runs_a_shared_step_once_with_its_first_change() -> None:
    calls = Calls()
    s1, shared, s2 = calls.step("s1"), calls.step("shared"), calls.step("s2")
    a = Change("apt", "package a", "install", None, "1", [s1, shared])
    b = Change("apt", "package b", "install", None, "2", [shared, s2])
    c = Change("apt", "package c", "install", None, "3", [shared])
    plan = Plan("h", [a, b, c])
    assert plan.steps() == [(a, s1), (a, shared), (b, s2)]


def test_two_equal_looking_steps_are_still_two_steps() -> None:
    # Steps are compared by identity: two Run objects with the same command both run.
    a = Change("r", "x", "set", None, "1", [Run("true", "t")])
    b = Change("r", "y", "set", None, "1", [Run("true", "t")])
    assert len(Plan("h", [a, b]).steps()) == 2


def test_apply_plan_runs_steps_in_order_and_returns_applied_changes() -> None:
    calls = Calls()
    s1, shared, s2 = calls.step("s1"), calls.step("shared"), calls.step("s2")
    a = Change("apt", "package a", "install", None, "1", [s1, shared])
    b = Change("apt", "package b", "install", None, "2", [shared, s2])
    no_steps = Change("apt", "note", "report", None, None, [])
    ctx = context()
    applied = apply_plan(Plan("h", [a, no_steps, b]), ctx)
    assert calls.names == ["s1", "shared", "s2"]
    assert applied == [a, b]
    assert ctx.log == ["apt/package a: mark s1", "apt/package a: mark shared",
                       "apt/package b: mark s2"]


def test_a_failing_step_raises_step_failed_with_what_was_applied_before() -> None:
    calls = Calls()
    first = Change("driver", "package a", "install", None, "1", [calls.step("a")])
    shared = calls.step("shared")
    second = Change("driver", "package b", "install", None, "2", [shared])
    third = Change("driver", "file /x", "create", None, "1",
                   [calls.step("boom", GpufleetError("disk full"))])
    fourth = Change("driver", "package c", "install", None, "3", [shared, calls.step("c")])
    fifth = Change("driver", "file /y", "create", None, "1", [calls.step("never")])
    ctx = context()
    with pytest.raises(StepFailed) as caught:
        apply_plan(Plan("h", [first, second, third, fourth, fifth]), ctx)
    assert str(caught.value) == "driver/file /x: mark boom: disk full"
    assert caught.value.change is third
    assert caught.value.applied == [first, second]
    assert isinstance(caught.value.__cause__, GpufleetError)
    assert calls.names == ["a", "shared", "boom"]
    assert ctx.log == ["driver/package a: mark a", "driver/package b: mark shared"]


def test_a_failing_shared_step_is_charged_to_its_first_change() -> None:
    calls = Calls()
    shared = calls.step("install", GpufleetError("apt failed"))
    a = Change("nccl", "package libnccl2", "upgrade", "1", "2", [shared])
    b = Change("nccl", "package libnccl-dev", "upgrade", "1", "2", [shared])
    with pytest.raises(StepFailed) as caught:
        apply_plan(Plan("h", [a, b]), context())
    assert caught.value.change is a
    assert caught.value.applied == []
    assert calls.names == ["install"]


def test_a_host_lost_mid_apply_keeps_the_changes_applied_before() -> None:
    calls = Calls()
    lost = Unreachable("connection to 10.0.0.1 was lost")
    first = Change("r", "a", "set", None, "1", [calls.step("a")])
    second = Change("r", "x", "set", None, "1", [calls.step("x", lost)])
    ctx = context()
    with pytest.raises(HostLost) as caught:
        apply_plan(Plan("h", [first, second]), ctx)
    assert isinstance(caught.value, Unreachable)
    assert caught.value.__cause__ is lost
    assert str(caught.value) == "r/x: mark x: connection to 10.0.0.1 was lost"
    assert caught.value.applied == [first]
    assert ctx.applied == [first]


def test_a_programming_error_in_a_step_is_not_wrapped() -> None:
    calls = Calls()
    change = Change("r", "x", "set", None, "1", [calls.step("x", KeyError("oops"))])
    with pytest.raises(KeyError):
        apply_plan(Plan("h", [change]), context())


def test_run_and_put_steps_on_a_local_connection(tmp_path: Path) -> None:
    target = tmp_path / "sub dir" / "out.conf"
    owner = f"{os.getuid()}:{os.getgid()}"
    put = Put(str(target), b"first\n", 0o640, owner)
    run = Run(f"printf done > '{tmp_path}/marker'", "write the marker")
    changes = [Change("r", "file", "create", None, "6 bytes", [put]),
               Change("r", "marker", "create", None, "x", [run])]
    ctx = context()
    assert apply_plan(Plan("h", changes), ctx) == changes
    assert target.read_bytes() == b"first\n"
    assert target.stat().st_mode & 0o7777 == 0o640
    assert (tmp_path / "marker").read_text() == "done"
    assert ctx.log == [f"r/file: write {target}", "r/marker: write the marker"]
    assert ctx.conn.round_trips == 2
    # a second write keeps the previous content as a backup
    apply_plan(Plan("h", [Change("r", "file", "update", None, None,
                                 [Put(str(target), b"second\n", 0o600, owner)])]), ctx)
    assert target.read_bytes() == b"second\n"
    assert target.stat().st_mode & 0o7777 == 0o600
    assert Path(f"{target}.gpufleet-bak").read_bytes() == b"first\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.conf",
                                                               "out.conf.gpufleet-bak"]


def test_a_failing_run_step_names_the_change_step_and_last_error_line() -> None:
    ok = Change("nccl_env", "sysctl a", "set", "1", "2", [Run("true", "sysctl a")])
    bad = Change("nccl_env", "sysctl b", "set", "1", "2",
                 [Run("echo first >&2; echo 'permission denied' >&2; exit 3", "sysctl b")])
    with pytest.raises(StepFailed) as caught:
        apply_plan(Plan("h", [ok, bad]), context())
    assert str(caught.value) == ("nccl_env/sysctl b: sysctl b: sysctl b failed (exit 3): "
                                 "permission denied")
    assert isinstance(caught.value.__cause__, CommandFailed)
    assert caught.value.applied == [ok]


def test_plan_properties_and_change_dict() -> None:
    calls = Calls()
    reboot = Change("driver", "kernel module nvidia", "reboot", "550.54.15", "550.127.05",
                    [calls.step("reboot")], pending_reboot=True)
    plain = Change("cuda", "link /usr/local/cuda", "link", "absent", "/usr/local/cuda-12.4",
                   diff=None)
    assert Plan("h").empty
    assert not Plan("h").reboot_required
    assert not Plan("h", [plain]).reboot_required
    assert Plan("h", [plain, reboot]).reboot_required
    assert reboot.to_dict() == {
        "role": "driver", "resource": "kernel module nvidia",
        "item": "driver/kernel module nvidia", "action": "reboot", "desired": "550.127.05",
        "actual": "550.54.15", "diff": None, "reboot_required": True}
