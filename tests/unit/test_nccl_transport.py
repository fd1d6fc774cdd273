"""NCCL transport verification in the AllReduce check, on real NCCL INFO logs of a 2x H200
node (tests/fixtures/real-node/): P2P over NVLink passes, SHM (P2P disabled) and NET/Socket
(P2P and SHM disabled) fail naming the transport and a channel line; the variables are
checked before any host is contacted; the NCCL log settings reach the probe on the NCCL
backend only."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.conformance import registry
from gpufleet.conformance.checks.allreduce import expected_transports
from gpufleet.conformance.checks.nccl_log import links, mismatches, observed, rank_hosts
from gpufleet.conformance.launch import ProbeRun, _command, _parse
from gpufleet.conformance.measure.allreduce import (
    nccl_log_args,
    probe_args,
    problem,
    transport_problem,
    transport_summary,
)
from gpufleet.conformance.session import Node
from gpufleet.connect.connection import ConnectOptions
from gpufleet.facts.gather import Facts
from gpufleet.inventory.load import load_inventory
from gpufleet.provision.engine import BadVariables
from gpufleet.suites.probes.allreduce import build_parser, nccl_log_environment
from tests.conftest import ROOT
from tests.probe_runs import PROBES, TORCHRUN, needs_torch, probe_env

LOGS = ROOT / "tests" / "fixtures" / "nccl"
REAL_NODE = ROOT / "tests" / "fixtures" / "real-node"


def log(name: str) -> str:
    return (REAL_NODE / f"nccl-debug-info-h200x2-{name}.txt").read_text()


def nodes(tmp_path: Path, variables: str = "", count: int = 1) -> list[Node]:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  vars:\n    allreduce_timeout_s: 90\n" + variables
                    + "  hosts:\n" + "".join(f"    node0{i}:\n" for i in range(1, count + 1)))
    return [Node(h, ConnectOptions(), Facts({}, {})) for h in load_inventory(path).select("all")]


def result_line(backend: str = "nccl", world: int = 2) -> str:
    """The probe's result event (the captures come from a plain all_reduce script)."""
    return json.dumps({"event": "result", "size": 1048576, "busbw": 100.0, "wrong": 0,
                       "world_size": world, "backend": backend})


def node_run(name: str, text: str, backend: str = "nccl", world: int = 2) -> ProbeRun:
    """A node-alone run whose torchrun printed ``text`` and the probe's result."""
    output = _parse(f"{text}\n{result_line(backend, world)}\n@@gpufleet-probe-rc=0\n", "")
    return ProbeRun([name], {name: output})


def two_node_run(text: str) -> ProbeRun:
    """The socket-fallback capture split by rank as two nodes' outputs (NCCL itself counted
    the ranks as two nodes there: ``nNodes 2``)."""
    by_rank = {rank: "\n".join(line for line in text.splitlines() if "] NCCL " in line
                               and f" [{rank}] " in line) for rank in (0, 1)}
    outputs = {name: _parse(f"{by_rank[rank]}\n{result_line()}\n@@gpufleet-probe-rc=0\n", "")
               for rank, name in enumerate(("node01", "node02"))}
    return ProbeRun(["node01", "node02"], outputs)


# ------------------------------------------------------------------------ the three real logs


def test_p2p_over_nvlink_passes(tmp_path: Path) -> None:
    [node] = nodes(tmp_path)
    run = node_run("node01", log("default"))
    assert run.error() is None
    assert transport_problem(run, node) is None
    assert problem(run, node, 1) is None
    assert transport_summary(run) == "intra P2P/CUMEM"


def test_p2p_disabled_fails_naming_shm(tmp_path: Path) -> None:
    [node] = nodes(tmp_path)
    run = node_run("node01", log("p2p-disabled"))
    assert problem(run, node, 1) == (
        "node01: NCCL used SHM between GPU 0 and GPU 1 (channel 00 : 0[0] -> 1[1] via "
        "SHM/direct/direct), expected P2P (NVLink) (and 1 more link(s) via SHM)")
    assert transport_summary(run) == "intra SHM/direct/direct"


def test_socket_fallback_fails_naming_net_socket(tmp_path: Path) -> None:
    [node] = nodes(tmp_path)
    assert problem(node_run("node01", log("socket-fallback")), node, 1) == (
        "node01: NCCL used NET/Socket between GPU 0 and GPU 1 (channel 00/0 : 0[0] -> 1[1] "
        "[send] via NET/Socket/0), expected P2P (NVLink) (and 1 more link(s) via NET/Socket)")


def test_a_lower_expectation_accepts_the_fallback_it_names(tmp_path: Path) -> None:
    [shm] = nodes(tmp_path, "    allreduce_transport_intra: shm\n")
    assert problem(node_run("node01", log("p2p-disabled")), shm, 1) is None
    assert problem(node_run("node01", log("default")), shm, 1) is None
    assert "NET/Socket" in str(problem(node_run("node01", log("socket-fallback")), shm, 1))
    [anything] = nodes(tmp_path, "    allreduce_transport_intra: any\n")
    assert problem(node_run("node01", log("socket-fallback")), anything, 1) is None


def test_across_nodes_a_socket_fallback_fails_the_pair(tmp_path: Path) -> None:
    first, _ = nodes(tmp_path, count=2)
    run = two_node_run(log("socket-fallback"))
    assert problem(run, first, 2) == (
        "NCCL used NET/Socket between node01 GPU 0 and node02 GPU 1 (channel 00/0 : 0[0] -> "
        "1[1] [send] via NET/Socket/0), expected NET/IB (InfiniBand/RoCE) (and 1 more "
        "link(s) via NET/Socket)")
    assert transport_summary(run) == "inter NET/Socket/0"
    socket, _ = nodes(tmp_path, "    allreduce_transport_inter: socket\n", count=2)
    assert problem(run, socket, 2) is None


def test_the_kept_log_is_bounded_and_holds_what_the_verdict_needs() -> None:
    raw = [line for line in log("default").splitlines() if " NCCL INFO " in line]
    run = node_run("node01", log("default"))
    kept = run.outputs["node01"].nccl_log
    assert len(raw) == 819
    assert len(kept) < 60
    assert "vm:622:622 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM" in kept
    assert any(" NCCL INFO comm 0x" in line and " rank 1 " in line for line in kept)
    assert any("Using network Socket" in line for line in kept)
    assert kept[-1] == raw[-1]
    assert run.to_dict()["nccl_log"] == {"node01": kept}
    assert not any(line.startswith("W1130") for line in kept)  # torchrun's own lines


# ---------------------------------------------------------------- what cannot be checked


def test_gloo_has_no_nccl_transport_to_check(tmp_path: Path) -> None:
    [node] = nodes(tmp_path)
    run = node_run("node01", "", backend="gloo")
    assert transport_problem(run, node) is None
    assert transport_summary(run) == "not checked: the gloo backend uses no NCCL transport"


def test_one_gpu_has_no_channel_to_check(tmp_path: Path) -> None:
    [node] = nodes(tmp_path)
    run = node_run("node01", "vm:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 1 nNodes 1 "
                   "localRanks 1 localRank 0 MNNVL 0", world=1)
    assert transport_problem(run, node) is None
    assert transport_summary(run) == "not checked: one NCCL rank, no channel between GPUs"


def test_a_real_single_gpu_run_reports_no_channel_to_check(tmp_path: Path) -> None:
    [node] = nodes(tmp_path)
    stdout = (LOGS / "allreduce-probe-h200x1-stdout.txt").read_text()
    run = ProbeRun(["gpu-local"], {"gpu-local": _parse(stdout, "")})
    assert run.error() is None
    assert run.summary is not None and run.summary["devices"] == ["NVIDIA H200"]
    assert problem(run, node, 1) is None
    assert transport_summary(run) == "not checked: one NCCL rank, no channel between GPUs"
    kept = run.outputs["gpu-local"].nccl_log
    assert any("Using network Socket" in line for line in kept)
    assert not any(" via " in line for line in kept)


def test_nccl_without_any_channel_in_its_log_is_unknown_not_a_pass(tmp_path: Path) -> None:
    [node] = nodes(tmp_path)
    assert str(problem(node_run("node01", ""), node, 1)).startswith(
        "unknown: NCCL's log shows no channel")


# ----------------------------------------------------------------------------- variables


def test_the_defaults_fit_an_hgx_node_and_values_are_case_blind(tmp_path: Path) -> None:
    [node] = nodes(tmp_path)
    assert expected_transports(node.host) == ("p2p", "ib")
    [nvls] = nodes(tmp_path, "    allreduce_transport_intra: NVLS\n"
                   "    allreduce_transport_inter: any\n")
    assert expected_transports(nvls.host) == ("nvls", "any")


@pytest.mark.parametrize(("line", "message"), [
    ("allreduce_transport_intra: nvlink",
     "variable allreduce_transport_intra must be one of p2p, nvls, shm, any, got 'nvlink'"),
    ("allreduce_transport_inter: roce",
     "variable allreduce_transport_inter must be one of ib, socket, any, got 'roce'"),
    ("allreduce_transport_inter: [ib]",
     "variable allreduce_transport_inter must be a string, got ['ib']"),
    ("allreduce_iters: many", "variable allreduce_iters must be an integer, got 'many'"),
])
def test_a_bad_value_names_host_variable_and_line(tmp_path: Path, line: str,
                                                  message: str) -> None:
    hosts = [n.host for n in nodes(tmp_path, f"    {line}\n")]
    with pytest.raises(BadVariables) as caught:
        registry.validate(hosts, [registry.suite("allreduce")])
    assert str(caught.value) == f"host node01: {message} ({tmp_path / 'hosts.yml'}:4)"


def test_conformance_refuses_a_bad_transport_before_contacting_a_host(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1:\n      ansible_host: 192.0.2.1\n"
                   "      allreduce_transport_intra: nvlink\n")
    assert app.conformance_cmd(str(inv), suites="allreduce") == 2
    assert capsys.readouterr().err == (
        "error: host gpu1: variable allreduce_transport_intra must be one of p2p, nvls, shm, "
        f"any, got 'nvlink' ({inv}:5)\n")


# ------------------------------------------------------- NCCL log settings and the probe


def test_the_log_settings_follow_the_inventory_nccl_environment() -> None:
    assert nccl_log_args({}) == ["--nccl-log", "NCCL_DEBUG=INFO", "--nccl-log",
                                 "NCCL_DEBUG_SUBSYS=INIT,NET", "--nccl-log", "NCCL_DEBUG_FILE="]
    kept = nccl_log_args({"NCCL_DEBUG": "trace", "NCCL_DEBUG_SUBSYS": "graph,init",
                          "NCCL_DEBUG_FILE": "/var/log/nccl.%h.%p"})
    assert kept[1::2] == ["NCCL_DEBUG=TRACE", "NCCL_DEBUG_SUBSYS=GRAPH,INIT,NET",
                          "NCCL_DEBUG_FILE="]
    quieter = nccl_log_args({"NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "^NET"})
    assert quieter[1::2] == ["NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET", "NCCL_DEBUG_FILE="]


def test_the_launch_command_carries_the_settings_to_the_probe(tmp_path: Path) -> None:
    [node] = nodes(tmp_path, "    nccl_env: {NCCL_DEBUG: WARN}\n")
    command = _command(node, rank=0, nodes=[node], probe="/tmp/gpufleet-probe-x/allreduce.py",
                       args=probe_args(node), timeout_s=90, port=29500, nproc=2)
    argv = shlex.split(command.split(" && ", 1)[1].split(";")[0])
    probe = argv.index("/tmp/gpufleet-probe-x/allreduce.py")
    assert argv[probe + 1:] == nccl_log_args({"NCCL_DEBUG": "WARN"})
    assert not any(word.startswith("NCCL_DEBUG") for word in argv[:probe])  # not torchrun's


def test_the_probe_sets_the_log_environment_on_nccl_only() -> None:
    args = build_parser().parse_args(nccl_log_args({}))
    assert nccl_log_environment("nccl", args.nccl_log) == {
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": ""}
    assert nccl_log_environment("gloo", args.nccl_log) == {}


def test_the_probe_refuses_other_variables() -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["--nccl-log", "LD_PRELOAD=/x.so"])
    assert caught.value.code == 64


@needs_torch
def test_a_real_gloo_run_takes_the_settings_and_reports_its_transport_unchecked(
        tmp_path: Path) -> None:
    done = subprocess.run([str(TORCHRUN), "--standalone", "--nnodes", "1", "--nproc-per-node",
                           "2", str(PROBES / "allreduce.py"), "--backend", "gloo", "--sizes",
                           "1K", "--iters", "1", "--warmup", "0", *nccl_log_args({})],
                          check=False, cwd=ROOT, env=probe_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    output = _parse(f"{done.stdout}\n@@gpufleet-probe-rc=0\n", done.stderr)
    run = ProbeRun(["node01"], {"node01": output})
    assert run.error() is None
    assert [r["backend"] for r in run.results] == ["gloo"]
    assert output.nccl_log == []
    [node] = nodes(tmp_path)
    assert problem(run, node, 1) is None
    assert transport_summary(run) == "not checked: the gloo backend uses no NCCL transport"


# ------------------------------------------- published logs of other NCCL versions (nccl/README)


def published_log(name: str) -> str:
    return (LOGS / name).read_text()


def test_nccl_2_7_names_gpus_by_bus_id_and_its_forced_net_ib_is_caught() -> None:
    """NCCL 2.7.6 puts the PCI bus id in the brackets (``2[c7000]``): every channel is still
    read, the GPU named by its rank, and NET/IB between GPUs of one host is a mismatch."""
    found = links(published_log("nccl-log-2.7.6-a100-busid-nvidia-nccl-707.txt"))
    assert len(found) == 11
    assert {(lk.transport, lk.same_host, lk.src_gpu) for lk in found} == {("NET/IB", True, -1)}
    assert observed(found)["intra"] == ["NET/IB/0/GDRDMA", "NET/IB/2/GDRDMA",
                                        "NET/IB/4/GDRDMA", "NET/IB/5/GDRDMA"]
    [message] = mismatches(found, "p2p", "ib")
    assert message.startswith("NCCL used NET/IB between rank 0 and rank 1 (channel 02 : "
                              "0[87000] -> 1[8d000] [send] via NET/IB/4/GDRDMA)")


def test_the_ib_plugin_ibext_counts_as_net_ib_across_nodes() -> None:
    """HPC-X's IB plugin prints ``via NET/IBext_v8/2``: InfiniBand, so ``ib`` passes (64 ranks
    on 8 nodes of 8 GPUs: the log's Init COMPLETE lines put ranks 32..36 on GPUs 0..4)."""
    text = published_log("nccl-log-ibext-v8-nvls-nvidia-nccl-1814.txt")
    assert rank_hosts(text) == {36: "hostname-test", 34: "hostname-test",
                                32: "hostname-test", 35: "hostname-test"}
    found = links(text, {rank: f"node{rank // 8}" for rank in range(64)})
    assert {(lk.transport, lk.same_host) for lk in found} == {("NET/IB", False)}
    assert observed(found)["inter"] == ["NET/IBext_v8/1", "NET/IBext_v8/2"]
    assert mismatches(found, "p2p", "ib") == []


def test_nccl_2_22_p2p_cumem_inside_a_node() -> None:
    found = links(published_log("nccl-log-2.22.3-p2p-cumem-nvidia-nccl-1538.txt"))
    assert [(lk.src, lk.dst, lk.transport, lk.detail, lk.src_gpu, lk.dst_gpu)
            for lk in found] == [(0, 7, "P2P", "P2P/CUMEM", 0, 7)]
    assert mismatches(found, "p2p", "ib") == []


@pytest.mark.parametrize("forged", ["@@gpufleet-probe-rc=0", "@@gpufleet-probe-rc=x",
                                    "@@gpufleet-probe-rc=99999999999999999999"])
def test_a_probe_that_prints_the_exit_marker_can_neither_set_nor_break_its_status(
        forged: str) -> None:
    """The status is the shell's own last line: a failing probe that prints the marker
    (a success, a word, a huge number) still failed, and nothing raises."""
    output = _parse(f"{forged}\n{result_line()}\n@@gpufleet-probe-rc=1\n", "")
    assert output.rc == 1
    assert _parse(f"{result_line()}\n{forged}x\n", "").rc is None
