"""NVIDIA's Xid catalogue (gpufleet/facts/xids.py) and the node program's copy of it, held
together; the rules that judge Xids in context; real kernel log lines judged by both
(tests/fixtures/nvidia/README.md says where each comes from)."""

from __future__ import annotations

import pytest

from gpufleet.facts import xids
from gpufleet.facts.parsers import xid as xid_parser
from gpufleet.node import healthcheck as program
from tests.conftest import FIXTURES

NVIDIA = FIXTURES / "nvidia"
# The flat table's critical Xids before the catalogue replaced it; docs/conformance.md says
# why the catalogue lets 63, 92 and 94 through.
FORMER_CRITICAL = (48, 56, 57, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140)


# ---- the catalogue -----------------------------------------------------------------------------

def test_every_code_nvidia_lists_has_a_known_class_and_bucket() -> None:
    assert sorted(xids.CATALOGUE) == list(range(1, 173))
    for code, entry in xids.CATALOGUE.items():
        assert entry.action in xids.CLASSES, code
        assert entry.resolution in {*xids.RESOLUTIONS, xids.NONE_GIVEN}, code
        assert entry.name, code
    assert {c for c, e in xids.CATALOGUE.items() if e.resolution == xids.NONE_GIVEN} == set(
        range(162, 173))
    assert set(xids.RESOLUTIONS.values()) == set(xids.CLASSES)


@pytest.mark.parametrize(("code", "name", "resolution", "action"), [
    (13, "Graphics Engine Exception", "RESTART_APP", "application"),
    (31, "GPU memory page fault", "RESTART_APP", "application"),
    (43, "GPU stopped processing", "IGNORE", "ignore"),
    (45, "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45", "ignore"),
    (48, "Double Bit ECC Error", "WORKFLOW_XID_48", "reset"),
    (54, "Auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS", "hardware"),
    (74, "NVLINK Error", "WORKFLOW_NVLINK_ERR", "reset"),
    (79, "GPU has fallen off the bus", "RESTART_BM", "reboot"),
    (95, "Uncontained memory error", "RESET_GPU", "reset"),
    (119, "GSP RPC Timeout", "RESET_GPU", "reset"),
    (151, "Key rotation Error", "RESTART_VM", "reboot"),
    (57, xids.UNUSED_NAME, "CONTACT_SUPPORT", "hardware"),
])
def test_catalogue_rows_as_nvidia_publishes_them(code: int, name: str, resolution: str,
                                                 action: str) -> None:
    assert xids.xid(code) == xids.Xid(name, resolution, action)


def test_the_former_critical_xids_still_drain_but_three() -> None:
    """63 (a row remapped: the ecc check fails on a pending remap), 92 (corrected errors)
    and 94 (contained: restart the application) no longer drain on their own."""
    let_through = {c for c in FORMER_CRITICAL if xids.xid(c).action not in xids.DRAINS}
    assert let_through == {63, 92, 94}
    assert [xids.xid(c).action for c in sorted(let_through)] == ["ignore", "ignore",
                                                                   "application"]


def test_an_xid_nvidia_does_not_list_is_an_application_one() -> None:
    assert xids.xid(173) == xids.UNKNOWN and xids.UNKNOWN.action == "application"


def test_the_node_program_carries_the_same_catalogue_and_rules() -> None:
    copy = {code: (e.action, e.resolution, e.name) for code, e in xids.CATALOGUE.items()}
    assert copy == program.XID_CATALOGUE
    unknown = (xids.UNKNOWN.action, xids.UNKNOWN.resolution, xids.UNKNOWN.name)
    assert unknown == program.XID_UNKNOWN
    assert (program.XID_CLASSES, program.XID_DRAINS) == (xids.CLASSES, xids.DRAINS)
    assert (program.XID_REPEATS, program.XID_REPEAT_WINDOW_S, program.XID_BURST_S) == (
        xids.REPEATS, xids.REPEAT_WINDOW_S, xids.BURST_S)


# ---- the rules ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "asked"), [
    # the values NVIDIA's catalogue names for Xid 154
    ("0x0 (None)", ("ignore", "None")),
    ("0x3 (Drain P2P)", ("reset", "Drain P2P")),
    ("0x4 (Drain and Reset)", ("reset", "Drain and Reset")),
    ("0x1 (GPU Reset Required)", ("reset", "GPU Reset Required")),
    ("0x2 (Node Reboot Required)", ("reboot", "Node Reboot Required")),
    # newer drivers' spellings, as public logs show them (595 and 610 open modules)
    ("0x1 (PF FLR)", ("reset", "PF FLR")),
    ("0x2 (OS Reboot)", ("reboot", "OS Reboot")),
    ("0x5 (Recover IMEX Domain)", ("reset", "Recover IMEX Domain")),
])
def test_xid_154_takes_the_recovery_action_it_names(text: str,
                                                    asked: tuple[str, str]) -> None:
    message = f"GPU recovery action changed from 0x0 (None) to {text}"
    assert xids.recovery_action(message) == asked
    assert program.xid_recovery_action(message) == asked
    assert xids.recovery_action("GPU recovery action changed") is None
    assert program.xid_recovery_action("GPU recovery action changed") is None


def test_a_burst_is_one_event_and_three_in_an_hour_repeat() -> None:
    starts = xids.burst_starts([0.0, 4.0, 9.0, 30.0, 1800.0, 1805.0, 3700.0])
    assert starts == [0.0, 0.0, 0.0, 30.0, 1800.0, 1800.0, 3700.0]
    distinct = sorted(set(starts))
    assert [xids.repeats(distinct, s) for s in starts] == [1, 1, 1, 2, 3, 3, 2]


def _events(text: str) -> list[dict[str, object]]:
    return xid_parser.xid_events(text)


def _judged(text: str) -> list[tuple[int, str, str, str]]:
    """(code, class, resolution, why) of each event, by the controller, checked against the
    node program's verdicts and messages on the same log."""
    ours = xids.judge(_events(text))
    theirs = program.judge_xids(program.parse_xid_events(text))
    assert [v.shown() for v in theirs] == [xids.describe(v) for v in ours]
    return [(v.code, v.action, v.resolution, v.why) for v in ours]


def test_the_third_burst_of_an_application_xid_on_one_gpu_needs_a_reset() -> None:
    line = "[{at:.6f}] NVRM: Xid (PCI:0000:{bus}:00): 31, pid=7, name=python3, MMU Fault\n"
    times = [(10.0, "3b"), (12.0, "3b"), (600.0, "3b"), (700.0, "5d"), (1200.0, "3b"),
             (5000.0, "3b")]
    judged = _judged("".join(line.format(at=at, bus=bus) for at, bus in times))
    assert [action for _, action, _, _ in judged] == [
        "application", "application", "application", "application", "reset", "application"]
    assert judged[4][3] == "3 times in 1 h on this GPU"


def test_an_unstamped_log_never_escalates() -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 13, pid=7, Graphics Exception\n"
    assert {action for _, action, _, _ in _judged(line * 5)} == {"application"}


# ---- real kernel logs ------------------------------------------------------------------------

RESET_154 = (154, "reset", "GPU Reset Required", "")


@pytest.mark.parametrize(("capture", "judged"), [
    ("journal_xid62_154_okm1045.txt",
     [(62, "reset", "RESET_GPU", ""), RESET_154, (109, "reset", "RESET_GPU", "")]),
    ("talos_xid154_okm446.txt", [RESET_154]),
    ("journal_xid120_62_154_forum364958.txt",
     [(120, "reset", "RESET_GPU", ""), RESET_154, (62, "reset", "RESET_GPU", ""), RESET_154,
      (45, "ignore", "WORKFLOW_XID_45", "")]),
    ("dmesg_T_xid79_154_rtx3090.txt",
     [(79, "reboot", "RESTART_BM", ""), (154, "reboot", "Node Reboot Required", "")]),
    ("syslog_xid48_64_gpuoperator1146.txt",
     [(48, "reset", "WORKFLOW_XID_48", ""), (64, "reset", "RESET_GPU", "")]),
    ("dmesg_ctime_xid13_109_gpud46.txt",
     [(13, "application", "RESTART_APP", "")] * 3 + [(109, "reset", "RESET_GPU", "")]),
    ("kmsg_xid144_149_145_gpud.txt",
     [(144, "application", "WORKFLOW_NVLINK5_ERR", "Nonfatal")]
     + [(149, "reset", "WORKFLOW_NVLINK5_ERR", "")] * 3
     + [(145, "application", "WORKFLOW_NVLINK5_ERR", "Nonfatal")]),
    ("journal_xid45_after_nvlink_okm1150.txt", [(45, "ignore", "WORKFLOW_XID_45", "")] * 7),
    ("a800_dmesg_xid13_vllm5901.txt", [(13, "application", "RESTART_APP", "")] * 6),
    ("syslog_xid13_relion436.txt", [(13, "application", "RESTART_APP", "")] * 4),
    ("dmesg_xid119_gpud.txt", [(119, "reset", "RESET_GPU", "")] * 5),
    ("dmesg_T_xid_akash244.txt",
     [(43, "ignore", "IGNORE", "")] * 2 + [(31, "application", "RESTART_APP", ""),
                                           (94, "application", "RESTART_APP", "")]),
])
def test_real_logs_judged_by_the_catalogue(capture: str,
                                           judged: list[tuple[int, str, str, str]]) -> None:
    assert _judged((NVIDIA / capture).read_text()) == judged


def test_a_burst_of_real_xid_13_lines_is_one_event() -> None:
    """Six Xid 13 within 16 ms (vllm#5901) are one burst: replayed twice more 25 minutes
    apart, the third burst needs a reset."""
    text = (NVIDIA / "a800_dmesg_xid13_vllm5901.txt").read_text()
    later = [text.replace("[93297.", f"[{93297 + i * 1500}.") for i in (1, 2)]
    judged = _judged(text + "".join(later))
    assert [action for _, action, _, _ in judged] == ["application"] * 12 + ["reset"] * 6


def test_the_worst_class_comes_first() -> None:
    text = (NVIDIA / "journal_xid120_62_154_forum364958.txt").read_text() + (
        NVIDIA / "dmesg_T_xid79_154_rtx3090.txt").read_text()
    worst = xids.worst_first(xids.judge(_events(text)))
    assert [v.code for v in worst[:2]] == [79, 154]
    assert xids.describe(worst[0]) == ("Xid 79 on 0000:02:00 (GPU has fallen off the bus): "
                                       "RESTART_BM [reboot]")
