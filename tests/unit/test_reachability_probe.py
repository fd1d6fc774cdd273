"""The reachability probe on this machine's loopback: the connect plan travels on stdin, so
its size is not bounded by the kernel's limit on one command-line argument (128 KiB)."""

from __future__ import annotations

import importlib.util
import json
import shlex
import socket
import subprocess
import sys
from types import ModuleType

import pytest

from gpufleet.conformance.measure.reachability import (
    PROBE,
    PortSpec,
    connect_time,
    measure,
    tcp_counts,
)
from gpufleet.conformance.nic_counters import Path as CountedPath
from gpufleet.conformance.session import Node
from gpufleet.connect.connection import CommandResult, ConnectOptions
from gpufleet.errors import GpufleetError
from gpufleet.facts.gather import Facts
from gpufleet.inventory.model import Host


def test_a_plan_larger_than_an_argument_may_be_is_read_from_stdin() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    open_port = listener.getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    plan = [[f"target-{i:05d}-with-a-long-name", "127.0.0.1",
             open_port if i == 1 else closed_port] for i in range(3000)]
    payload = json.dumps(plan).encode()
    assert len(payload) > 128 * 1024
    try:
        proc = subprocess.run([sys.executable, str(PROBE), "connect", "2", "64"], input=payload,
                              capture_output=True, timeout=120, check=False)
    finally:
        listener.close()
    assert proc.returncode == 0, proc.stderr
    states = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert len(states) == 3000
    assert states[f"target-00001-with-a-long-name {open_port}"] == "open"
    assert states[f"target-00000-with-a-long-name {closed_port}"] == "refused"


def test_the_connect_budget_grows_with_the_plan() -> None:
    assert connect_time(1) == 4.0
    assert connect_time(256) == 4.0
    assert connect_time(257) == 6.0
    assert connect_time(640 * 639 * 6) > 600


def test_connects_leave_from_the_source_band_and_the_port_is_free_again_at_once() -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    seen: list[int] = []

    def accept() -> None:
        for _ in range(2):
            conn, peer = listener.accept()
            seen.append(peer[1])
            conn.close()

    import threading

    thread = threading.Thread(target=accept)
    thread.start()
    band = "40100-40100"
    try:
        for run in range(2):  # the same 4-tuple twice in a row: no TIME_WAIT in between
            proc = subprocess.run([sys.executable, str(PROBE), "connect", "2", "8", band],
                                  input=json.dumps([["t", "127.0.0.1", port]]).encode(),
                                  capture_output=True, timeout=60, check=False)
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout.decode().splitlines()[-1]) == {f"t {port}": "open"}, run
    finally:
        thread.join(timeout=10)
        listener.close()
    assert seen == [40100, 40100]


class _Scripted:
    """A node's connection that answers the listener and kill commands, and each connect
    sweep from the next of ``sweeps``: {"target port": state}."""

    def __init__(self, sweeps: list[dict[str, str]], tcp: list[str] | None = None) -> None:
        self.sweeps = sweeps
        self.tcp = tcp or []
        self.plans: list[list[list[object]]] = []

    def run(self, command: str, timeout: float, stdin: bytes | None = None) -> CommandResult:
        mode = shlex.split(command)[3] if command.startswith("python") else "kill"
        if mode == "listen":
            out = json.dumps({"pid": 4242, "bound": [29500, 50000], "busy": []})
        elif mode == "connect":
            assert stdin is not None
            self.plans.append(json.loads(stdin))
            out = json.dumps(self.sweeps.pop(0))
            if self.tcp:
                out = self.tcp.pop(0) + "\n" + out
        else:
            out = ""
        return CommandResult(command, 0, out + "\n", "", 0.0)

    def close(self) -> None:
        pass


def _node(name: str, conn: _Scripted) -> Node:
    host = Host(name, {"ansible_host": {"a": "10.0.0.1", "b": "10.0.0.2"}[name]},
                frozenset({"all"}))
    return Node(host, ConnectOptions(), facts=Facts(name),
                connector=lambda *_: conn)  # type: ignore[arg-type,return-value]


def test_a_connection_that_is_not_open_is_looked_at_again_and_the_second_answer_counts() -> None:
    spec = PortSpec([29500, 50000], 0, -1)
    first = _Scripted([{"b 29500": "filtered", "b 50000": "refused"},
                       {"b 29500": "open", "b 50000": "refused"}])
    second = _Scripted([{"a 29500": "open", "a 50000": "open"}])
    matrix = measure({"a": _node("a", first), "b": _node("b", second)},
                     [("a", "b"), ("b", "a")], spec)
    assert first.plans[1] == [["b", "10.0.0.2", 29500], ["b", "10.0.0.2", 50000]]
    assert len(second.plans) == 1, "every connection from b was open: no second sweep"
    assert matrix.results[("a", "b", 29500)] == "open"
    assert matrix.results[("a", "b", 50000)] == "refused"
    assert matrix.failures_to("b") == {50000: ["a (refused)"]}
    assert matrix.to_dict()["first_answers"] == {"a b 29500": "filtered", "a b 50000": "refused"}


def test_a_busy_port_is_told_apart_from_a_port_another_program_listens_on() -> None:
    service = socket.socket()
    service.bind(("127.0.0.1", 0))
    service.listen(8)
    listened = service.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", listened))
    taken = client.getsockname()[1]
    spare = socket.socket()
    spare.bind(("127.0.0.1", 0))
    free = spare.getsockname()[1]
    spare.close()
    try:
        proc = subprocess.run([sys.executable, str(PROBE), "listen", "1",
                               f"{listened},{taken},{free}"], capture_output=True, timeout=60,
                              check=False)
    finally:
        client.close()
        service.close()
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.decode().splitlines()[-1])
    assert (info["bound"], sorted(info["busy"]), info["listened"]) == (
        [free], sorted([listened, taken]), [listened])


def test_a_fixed_port_taken_by_the_node_s_own_connection_is_not_probed() -> None:
    class Taken(_Scripted):
        def run(self, command: str, timeout: float, stdin: bytes | None = None
                ) -> CommandResult:
            if shlex.split(command)[3:4] == ["listen"]:
                return CommandResult(command, 0, json.dumps(
                    {"pid": 7, "bound": [29500], "busy": [50000], "listened": []}) + "\n",
                    "", 0.0)
            return super().run(command, timeout, stdin)

    spec = PortSpec([29500, 50000], 0, -1)
    source = _Scripted([{"b 29500": "open"}])
    target = Taken([{"a 29500": "open", "a 50000": "open"}])
    matrix = measure({"a": _node("a", source), "b": _node("b", target)},
                     [("a", "b"), ("b", "a")], spec)
    assert source.plans[0] == [["b", "10.0.0.2", 29500]]
    assert matrix.failures_to("b") == {}
    assert matrix.listeners["b"] == ("ports taken by the node's own connections, not probed: "
                                     "[50000]")


def test_each_answered_connect_s_segments_are_counted_per_target() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    plan = [["t", "127.0.0.1", port], ["t", "127.0.0.1", closed_port],
            ["u", "127.0.0.1", closed_port]]
    try:
        proc = subprocess.run([sys.executable, str(PROBE), "connect", "2", "8"],
                              input=json.dumps(plan).encode(), capture_output=True,
                              timeout=60, check=False)
    finally:
        listener.close()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    counts = json.loads(lines[-2])["tcp"]
    assert set(counts) == {"t", "u"}
    assert counts["t"][0] == 0 and counts["t"][1] >= 2  # a SYN each, and the open one's ACK


def _probe_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reachability_probe", PROBE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_filtered_connect_s_own_syn_retransmits_count_against_no_one(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    probe = _probe_module()
    answers = {29500: ("open", (0, 3)), 50000: ("filtered", (2, 3)),
               50001: ("refused", (1, 2)), 50002: ("no route", (0, 1))}
    monkeypatch.setattr(probe, "classify", lambda _a, port, *_: answers[port])
    probe.connect(2.0, [["b", "10.0.0.2", p] for p in answers], 4)
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[-2]) == {"tcp": {"b": [1, 5]}}
    assert json.loads(lines[-1])["b 50000"] == "filtered"


def test_a_source_s_counts_sum_over_its_sweeps_and_a_bad_tcp_line_costs_only_them() -> None:
    spec = PortSpec([29500, 50000], 0, -1)
    first = _Scripted([{"b 29500": "open", "b 50000": "filtered"}, {"b 50000": "open"}],
                      ['{"tcp": {"b": [12, 100]}}', '{"tcp": {"b": [3, 4]}}'])
    second = _Scripted([{"a 29500": "open", "a 50000": "open"}],
                       ['{"tcp": {"c": [99999999999, 1]}}'])
    matrix = measure({"a": _node("a", first), "b": _node("b", second)},
                     [("a", "b"), ("b", "a")], spec)
    assert matrix.paths() == {"a": [CountedPath("a", "b", 15, 104)]}
    assert matrix.results[("b", "a", 50000)] == "open"
    assert matrix.tcp_unknown == {"b": "the connect probe on b: the tcp line names 'c' with "
                                       "[99999999999, 1]"}
    assert tcp_counts('{"tcp": {}}\n{}', {"b"}) == {}
    with pytest.raises(GpufleetError, match="no tcp line"):
        tcp_counts("{}", {"b"})
    with pytest.raises(GpufleetError, match="the tcp line is"):
        tcp_counts('{"pid": 1}\n{}', {"b"})
    with pytest.raises(GpufleetError, match="the tcp line:"):
        tcp_counts('[[[[' * 5000 + "\n{}", {"b"})
