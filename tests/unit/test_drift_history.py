"""Drift history: what each host had when last checked, role by role; new and resolved."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from gpufleet.drift.compare import DriftItem, HostDrift, mark_new
from gpufleet.drift.history import History

NCCL = "nccl/hold libnccl-dev"
SYSCTL = "nccl_env/sysctl net.ipv4.ip_local_port_range"
FIREWALL = "firewall/live ruleset (nftables)"


def doc(hosts: dict[str, tuple[str, list[str]]], roles: list[str] | None = None
        ) -> dict[str, Any]:
    document: dict[str, Any] = {"hosts": {
        name: {"status": status, "items": [{"item": item} for item in items]}
        for name, (status, items) in hosts.items()}}
    if roles is not None:
        document["roles_checked"] = roles
    return document


def drifted(host: str, *items: str) -> HostDrift:
    found = [DriftItem(host, i.split("/", 1)[0], i.split("/", 1)[1], "other", "a", "b")
             for i in items]
    return HostDrift(host, "drifted" if found else "clean", found)


def test_the_newest_checked_run_of_each_host_counts(tmp_path: Path) -> None:
    history = History(tmp_path, "drift")
    history.save(doc({"a": ("drifted", [NCCL]), "b": ("drifted", [SYSCTL])}))
    history.save(doc({"a": ("clean", []), "b": ("unreachable", [])}))
    assert history.last_items() == {"a": set(), "b": {SYSCTL}}


def test_a_partial_run_does_not_make_other_roles_new_again(tmp_path: Path) -> None:
    history = History(tmp_path, "drift")
    history.save(doc({"a": ("drifted", [NCCL, FIREWALL])},
                     roles=["consistency", "firewall", "nccl", "nccl_env"]))
    history.save(doc({"a": ("clean", [])}, roles=["consistency", "nccl"]))  # nccl fixed
    assert history.last_items() == {"a": {FIREWALL}}
    hosts = {"a": drifted("a", FIREWALL, SYSCTL)}
    new, resolved = mark_new(hosts, history.last_items())
    assert (new, resolved) == (["a " + SYSCTL], [])
    assert [i.new for i in hosts["a"].items] == [False, True]


def test_runs_without_roles_checked_covered_every_role(tmp_path: Path) -> None:
    history = History(tmp_path, "drift")
    history.save(doc({"a": ("drifted", [NCCL, FIREWALL])}))
    history.save(doc({"a": ("drifted", [SYSCTL])}, roles=["nccl_env"]))
    assert history.last_items() == {"a": {NCCL, FIREWALL, SYSCTL}}


def test_a_partial_run_resolves_only_the_roles_it_checked(tmp_path: Path) -> None:
    history = History(tmp_path, "drift")
    history.save(doc({"a": ("drifted", [NCCL, FIREWALL])}))
    new, resolved = mark_new({"a": drifted("a")}, history.last_items(), {"nccl"})
    assert (new, resolved) == ([], ["a " + NCCL])


def test_history_is_bounded_and_skips_unreadable_runs(tmp_path: Path) -> None:
    history = History(tmp_path, "drift", keep=2)
    for index in range(4):
        history.save(doc({"a": ("drifted", [f"nccl/item {index}"])}))
    assert len(history.runs()) == 2
    history.runs()[-1].write_text("{not json")
    assert history.last_items() == {"a": {"nccl/item 2"}}
    assert json.loads(history.runs()[0].read_text())["hosts"]["a"]["status"] == "drifted"


@pytest.mark.parametrize(("text", "why"), [
    ("[1, 2, 3]", "not a drift report (no 'hosts' mapping)"),
    ('{"hosts": []}', "not a drift report (no 'hosts' mapping)"),
    ('{"hosts": {"a": {"status": "clean", "items": "x"}}}', "host 'a' has no list of items"),
    ('{"hosts": {"a": {"status": "clean", "items": [{"no": 1}]}}}',
     "host 'a' has no list of items"),
    ('{"hosts": {}, "roles_checked": "nccl"}', "'roles_checked' is not a list of role names"),
    ("{not json", "not JSON"),
    ("[" * 50_000, "nested too deep"),
])
def test_a_malformed_run_file_is_left_out_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, why: str) -> None:
    history = History(tmp_path, "drift")
    history.save(doc({"a": ("drifted", [NCCL])}))
    bad = tmp_path / "drift-29991231T235959.000000Z.json"  # the newest
    bad.write_text(text)
    with caplog.at_level(logging.WARNING, logger="gpufleet.drift"):
        assert history.last_items() == {"a": {NCCL}}
    [warning] = caplog.messages
    assert warning.startswith(f"drift history {bad} is unusable and was left out: ")
    assert why in warning

