"""Every open finding of a node in its drain reason: the format, the merge of one run's
findings with everybody else's, and the node program's copy of both, held together."""

from __future__ import annotations

import pytest

from gpufleet.node import healthcheck as program
from gpufleet.slurm import findings
from gpufleet.slurm.findings import Finding, parse, reason_for, reconcile, render

T0, T1 = 1764590000, 1764593600


def test_a_reason_names_its_first_finding_in_the_first_20_characters() -> None:
    reason = render([Finding("conformance", "gpu/health", T0), Finding("drift", "nccl_env", T1)],
                    "GPU0: 2 uncorrectable ECC errors since boot")
    assert reason == ("gf gpu/health: GPU0: 2 uncorrectable ECC errors since boot (+1 more) "
                      f"{{gf1 c:gpu/health@{T0} d:nccl_env@{T1}}}")
    assert reason[:20] == "gf gpu/health: GPU0:"
    assert parse(reason) == [Finding("conformance", "gpu/health", T0),
                             Finding("drift", "nccl_env", T1)]
    assert findings.message_of(reason) == "GPU0: 2 uncorrectable ECC errors since boot"


@pytest.mark.parametrize(("reason", "parsed"), [
    (None, None),
    ("maintenance: replace PSU | ticket=OPS-12", None),   # an operator's
    ("gpufleet: conformance/reachability: port 29500 closed",   # an earlier version's
     [Finding("conformance", "reachability", 0)]),
    ("gpufleet: healthcheck/port_range: 32768-60999", [Finding("healthcheck", "port_range", 0)]),
    ("gpufleet: drift/nccl_env/file /etc/nccl.conf: desired 127 bytes",
     [Finding("drift", "nccl_env", 0)]),
    ("gf hc/xid: Xid 79 {gf1 h:xid@5 x:bad@1 h:bad token}", [Finding("healthcheck", "xid", 5)]),
    ("gpufleet: certify failed (site drain hook)", None),   # a site's hook: an operator's
])
def test_only_gpufleets_reasons_are_read_as_findings(reason: str | None,
                                                      parsed: list[Finding] | None) -> None:
    assert parse(reason) == parsed


def test_a_run_clears_only_what_it_checked_again_and_passed() -> None:
    """A drift that finds nccl_env clean never lifts a conformance finding (the node drained
    for ECC errors stays drained), and a conformance run clears only its checks."""
    open_ = [Finding("conformance", "gpu/health", T0), Finding("drift", "nccl_env", T0)]
    after_drift = reconcile(open_, "drift", {}, ["nccl_env", "driver"], now=T1)
    assert after_drift == [Finding("conformance", "gpu/health", T0)]
    after_conformance = reconcile(after_drift, "conformance", {"stack/versions": "skew"},
                                  ["firewall/live_rules_admit_the_cluster"], now=T1)
    assert after_conformance == [Finding("conformance", "gpu/health", T0),
                                 Finding("conformance", "stack/versions", T1)]
    assert reconcile(after_conformance, "conformance", {},
                     ["gpu/health", "stack/versions"], now=T1) == []


def test_a_finding_open_again_keeps_its_since() -> None:
    open_ = [Finding("healthcheck", "xid", T0)]
    assert reconcile(open_, "healthcheck", {"xid": "Xid 79 again"}, ["gpus"], now=T1) == open_


def test_the_message_shown_is_this_runs_else_kept_else_since_when() -> None:
    now = [Finding("drift", "nccl_env", T0)]
    assert reason_for(now, "drift", {"nccl_env": "file differs"}, None).startswith(
        "gf drift/nccl_env: file differs {gf1")
    before = render([Finding("conformance", "gpu/health", T0), *now], "ECC")
    kept = [Finding("conformance", "gpu/health", T0), *now]
    assert reason_for(kept, "drift", {"nccl_env": "x"}, before).startswith(
        "gf gpu/health: ECC (+1 more)")
    assert reason_for(now, "conformance", {}, before).startswith(
        "gf drift/nccl_env: open since 2025-12-01T11:53Z")


def test_the_text_cannot_break_the_reason() -> None:
    reason = render([Finding("conformance", findings.clean_id("gpu/health {x}@y z"), T0)],
                    'bad "text"\n{gf1 c:fake@1}')
    assert reason == ("gf gpu/health__x__y_z: bad 'text' (gf1 c:fake@1) "
                      f"{{gf1 c:gpu/health__x__y_z@{T0}}}")
    assert parse(reason) == [Finding("conformance", "gpu/health__x__y_z", T0)]


@pytest.mark.parametrize("reason", [
    render([Finding("conformance", "gpu/health", T0), Finding("drift", "nccl_env", T1)], "ECC"),
    render([Finding("healthcheck", "xid", T0)], "Xid 79 on 0000:3b:00"),
    render([Finding("prolog", "gpu_processes", T0), Finding("epilog", "gpu_memory", T1)],
           "compute process(es) on the job's GPUs: pid 4242 (python3, 1024 MiB) on GPU0"),
    "gpufleet: drift/nccl_env/file /etc/nccl.conf: desired 127 bytes",
    "gpufleet: certify failed",
    "maintenance: replace PSU",
])
def test_the_node_program_reads_reasons_as_the_controller_does(reason: str) -> None:
    ours = parse(reason)
    theirs = program.parse_findings(reason)
    letters = {source: letter for source, letter in findings.SOURCES.items()}
    assert theirs == (None if ours is None else [(letters[f.source], f.id, f.since)
                                                   for f in ours])
    assert program.message_of(reason) == findings.message_of(reason)


def test_the_node_program_writes_what_the_controller_writes() -> None:
    found = [("c", "gpu/health", T0), ("h", "xid", T1)]
    assert program.render_reason(found, "ECC") == render(
        [Finding("conformance", "gpu/health", T0), Finding("healthcheck", "xid", T1)], "ECC")
    assert (program.PREFIX, program.LEGACY, program.MESSAGE_LIMIT, program.MOST) == (
        findings.PREFIX, findings.LEGACY, findings.MESSAGE_LIMIT, findings.MOST)
    assert {letter: program.LABELS[letter] for letter in program.LETTERS} == {
        letter: findings.LABELS[source] for source, letter in findings.SOURCES.items()}


def test_the_health_check_keeps_the_controllers_findings() -> None:
    """The defect it fixes: a transient nvidia-smi error used to replace a conformance drain
    with the health check's own, which it then lifted at the next healthy run."""
    conformance = render([Finding("conformance", "allreduce/each_node_alone", T0)],
                         "busbw 12 GB/s, gate 330")
    failing = [program.Result("gpus", "FAIL", "nvidia-smi did not answer within 4.0s")]
    drained, ours = program.reconcile_reason(conformance, failing, T1)
    assert ours and drained is not None
    assert drained.startswith("gf allreduce/each_node_alone: busbw 12 GB/s, gate 330 (+1 more)")
    healthy = [program.Result("gpus", "PASS", "1 GPU(s)"), program.Result("xid", "PASS", "ok")]
    after, _ = program.reconcile_reason(drained, healthy, T1 + 60)
    assert after == conformance
    assert program.reconcile_reason("maintenance", failing, T1) == ("maintenance", False)
    assert program.reconcile_reason(None, healthy, T1) == (None, True)


def test_holds_tells_whether_a_reason_shows_a_run() -> None:
    current = [Finding("conformance", "gpu/health", T0), Finding("drift", "nccl_env", T1)]
    assert findings.holds(current, "drift", {"nccl_env": "differs"}, ["cuda"])
    assert not findings.holds(current, "drift", {"driver": "differs"}, [])
    assert not findings.holds(current, "drift", {}, ["nccl_env"])
    assert findings.holds(current, "healthcheck", {}, ["gpu/health"])


def test_the_prolog_and_epilog_write_their_own_sources() -> None:
    reason = program.render_reason([("p", "xid", T0), ("e", "gpu_processes", T1)], "Xid 79")
    assert reason == (f"gf prolog/xid: Xid 79 (+1 more) {{gf1 p:xid@{T0} e:gpu_processes@{T1}}}")
    assert reason == render([Finding("prolog", "xid", T0), Finding("epilog", "gpu_processes", T1)],
                            "Xid 79")
    assert parse(reason) == [Finding("prolog", "xid", T0), Finding("epilog", "gpu_processes", T1)]
    assert render([Finding("epilog", "gpu_memory", T0)], "GPU0: 2048 MiB used").startswith(
        "gf epilog/gpu_memory: GPU0: 2048 MiB used {gf1 e:gpu_memory@")


def test_the_prolog_only_adds_and_the_health_check_clears_what_it_checks_again() -> None:
    """The prolog never resumes a node; the periodic health check clears the prolog's and
    the epilog's findings of the checks it runs itself (gpus, ecc, xid), never the others
    (gpu_processes: a running job's processes are legitimate outside the prolog)."""
    drained = render([Finding("prolog", "ecc", T0), Finding("epilog", "gpu_processes", T0)],
                     "GPU0: 2 uncorrectable ECC error(s)")
    passing = [program.Result("ecc", "PASS", "ok"), program.Result("gpus", "PASS", "ok")]
    assert program.reconcile_reason(drained, passing, T1, "p", "") == (drained, True)
    after, ours = program.reconcile_reason(drained, passing, T1)
    assert ours and after == render([Finding("epilog", "gpu_processes", T0)],
                                    "open since 2025-12-01T11:53Z")
    failing = [program.Result("gpus", "FAIL", "job 42's GPU(s) 3 not found")]
    added, _ = program.reconcile_reason(drained, failing, T1, "p", "")
    assert parse(added) == [Finding("prolog", "ecc", T0), Finding("epilog", "gpu_processes", T0),
                            Finding("prolog", "gpus", T1)]
