"""The per-node lock over a real (local) connection: taken atomically, waited for, named to
the run that finds it held, taken over once stale, and removed only by its holder."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gpufleet.connect.connection import Budget
from gpufleet.connect.local import LocalConnection
from gpufleet.inventory.model import Host
from gpufleet.provision import nodelock
from gpufleet.provision.nodelock import Holder, NodeLocked, acquire, release


@pytest.fixture
def conn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalConnection:
    monkeypatch.setattr(nodelock, "LOCK", str(tmp_path / "run" / "gpufleet" / "lock"))
    monkeypatch.setattr(nodelock, "POLL_S", 0.2)
    return LocalConnection(Host("node01", {"ansible_connection": "local"}, frozenset()),
                           Budget())


def other(until_s: float) -> Holder:
    now = time.time()
    return Holder("drift --remediate", "ctl-b", 4242, now - 60, now + until_s, "b" * 32)


def test_the_lock_is_taken_and_released_by_its_holder(conn: LocalConnection) -> None:
    mine = Holder.this_run("provision", 600)
    assert acquire(conn, mine, 1) == ("acquired", False)
    lock = Path(nodelock.LOCK)
    assert (lock / "holder").read_text().splitlines()[0] == "command=provision"
    release(conn, other(600))  # not its holder: left alone
    assert lock.is_dir()
    release(conn, mine)
    assert not lock.exists()


def test_a_held_lock_is_waited_for_then_names_its_holder(conn: LocalConnection) -> None:
    assert acquire(conn, other(600), 1).note == "acquired"
    start = time.monotonic()
    with pytest.raises(NodeLocked) as caught:
        acquire(conn, Holder.this_run("provision", 600), 1.0)
    assert 0.8 <= time.monotonic() - start < 5
    message = str(caught.value)
    assert message.startswith("the node is being changed by drift --remediate from ctl-b "
                              "(pid 4242) since ")
    assert message.endswith("waited 1s (--lock-timeout), not changed")


def test_a_lock_freed_while_waiting_is_taken(conn: LocalConnection) -> None:
    held = other(600)
    acquire(conn, held, 1)
    threading.Timer(0.5, lambda: release(conn.reopen(), held)).start()
    taken = acquire(conn, Holder.this_run("provision", 600), 5)
    assert taken.waited
    assert taken.note.startswith("acquired after waiting ")
    assert " for drift --remediate from ctl-b (pid " in taken.note


def test_a_stale_lock_is_taken_over(conn: LocalConnection) -> None:
    acquire(conn, other(-10), 1)  # its holder's deadline has passed
    assert acquire(conn, Holder.this_run("provision", 600), 1) == (
        "acquired (a stale lock, past its holder's deadline, was taken over)", False)
    assert "command=provision" in (Path(nodelock.LOCK) / "holder").read_text()


def test_holder_text_cannot_break_its_lines() -> None:
    holder = Holder("provision\nuntil=0", "ctl\r", 1, 0, 10, "a" * 32)
    assert holder.text().splitlines()[0] == "command=provision_until=0"
    assert nodelock.describe("") == "another run (its details are being written)"
