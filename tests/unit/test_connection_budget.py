"""Connections under a host's budget, and become by prompt: run on this machine through the
local connection (real sh, real coreutils timeout; sudo is a stand-in that prompts)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.connect.connection import (
    BecomeFailed,
    Budget,
    CommandTimeout,
    HostCancelled,
    become_prefix,
)
from gpufleet.connect.local import LocalConnection
from gpufleet.inventory.model import Host

FAKE_BIN = Path(__file__).resolve().parents[1] / "fixtures" / "bin"
SECRET = "s3cret-pw"


def local(**variables: object) -> LocalConnection:
    return LocalConnection(Host("local", {"ansible_connection": "local", **variables},
                                frozenset({"all"})))


@pytest.fixture
def fake_sudo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PATH", f"{FAKE_BIN}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SUDO_PASSWORD", SECRET)
    yield


# --------------------------------------------------------------------------- budget


def test_a_command_is_bounded_by_what_is_left_of_the_budget() -> None:
    conn = local()
    conn.budget.start(1.5)
    start = time.monotonic()
    with pytest.raises(CommandTimeout, match=r"^stopped at the host's deadline: sleep 30$"):
        conn.run("sleep 30", timeout=600)
    assert time.monotonic() - start < 4
    assert conn.budget.cancelled
    with pytest.raises(HostCancelled, match=r"^host timed out after 1.5s; not sent: true$"):
        conn.run("true")


def test_a_command_timeout_within_the_budget_is_the_commands_own() -> None:
    conn = local()
    conn.budget.start(60)
    with pytest.raises(CommandTimeout, match=r"^command timed out after 1s: echo partial") as err:
        conn.run("echo partial; sleep 30", timeout=1)
    assert err.value.partial.stdout == "partial\n"
    assert not conn.budget.cancelled
    assert conn.run("echo still here").stdout == "still here\n"


def test_a_cancelled_host_gets_no_further_command_and_no_reconnect(tmp_path: Path) -> None:
    conn = local()
    conn.budget.cancel("host timed out after 5s")
    marker = tmp_path / "ran"
    with pytest.raises(HostCancelled, match=r"^host timed out after 5s; not sent: touch "):
        conn.run(f"touch {marker}")
    assert not marker.exists()
    with pytest.raises(HostCancelled, match="not sent: reconnect"):
        conn.reopen()


def test_cancel_stops_the_command_that_is_running() -> None:
    budget = Budget(60)
    conn = LocalConnection(local().host, budget)
    start = time.monotonic()
    threading.Timer(0.5, budget.cancel, args=("host timed out after 1s",)).start()
    with pytest.raises(HostCancelled):
        conn.run("sleep 30")
    assert time.monotonic() - start < 5


def test_a_spent_budget_admits_nothing() -> None:
    budget = Budget(0.01)
    time.sleep(0.05)
    assert budget.spent
    with pytest.raises(HostCancelled, match=r"^host deadline of 0.01s reached; not sent: x$"):
        budget.admit("x")


def test_reopen_shares_the_budget() -> None:
    conn = local()
    conn.budget.start(30)
    again = conn.reopen()
    assert again.budget is conn.budget
    conn.budget.cancel("stop")
    with pytest.raises(HostCancelled):
        again.run("true")


# --------------------------------------------------------------------------- become


def test_become_without_password_never_asks() -> None:
    words, conversation = become_prefix("root", None)
    assert words == ["sudo", "-n", "-H", "-u", "root", "--"]
    assert conversation is None


def test_the_password_is_never_on_the_command_line() -> None:
    words, conversation = become_prefix("root", SECRET)
    assert conversation is not None
    assert not any(SECRET in w for w in words)
    assert words[:4] == ["sudo", "-S", "-p", conversation.prompt.decode()]


def test_the_password_is_sent_when_sudo_prompts_and_stdin_after(fake_sudo: None) -> None:
    conn = local(ansible_become=True, ansible_become_password=SECRET)
    result = conn.run("cat; echo done", stdin=b"NCCL_DEBUG=WARN\n")
    assert result.stdout == "NCCL_DEBUG=WARN\ndone\n"
    assert result.stderr == ""


def test_a_file_written_through_become_never_holds_the_password(fake_sudo: None,
                                                                 tmp_path: Path) -> None:
    conn = local(ansible_become=True, ansible_become_password=SECRET)
    target = tmp_path / "nccl.env"
    conn.put(str(target), b"NCCL_DEBUG=WARN\n", owner=f"{os.getuid()}:{os.getgid()}")
    assert target.read_bytes() == b"NCCL_DEBUG=WARN\n"


def test_without_a_prompt_the_password_is_never_sent(fake_sudo: None, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SUDO_NOPASSWD", "1")
    conn = local(ansible_become=True, ansible_become_password=SECRET)
    result = conn.run("cat", stdin=b"payload\n")
    assert result.stdout == "payload\n"
    assert SECRET not in result.stdout + result.stderr


def test_a_wrong_password_is_sent_once_then_refused(fake_sudo: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SUDO_PASSWORD", "another")
    conn = local(ansible_become=True, ansible_become_password=SECRET)
    with pytest.raises(BecomeFailed, match=r"^sudo on local rejected the become password "):
        conn.run("cat", stdin=b"payload\n")
