"""Parsers checked against real captured output and hand-made variants of the same formats."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpufleet import errors
from gpufleet.facts import parsers
from gpufleet.facts.parsers import (
    ParseError,
    cuda,
    nccl_tests,
    network,
    nvidia_smi,
    packages,
    qos,
    system,
    xid,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def sample(name: str) -> str:
    return (FIXTURES / "samples" / name).read_text()


def h200(name: str) -> str:
    return (FIXTURES / "h200x2" / name).read_text()


def test_parse_error_is_reexported() -> None:
    assert parsers.ParseError is errors.ParseError


# --------------------------------------------------------------------------- mlnx_qos

MLNX_QOS_REAL = "mlnx_qos_dscp_trust_prio3.txt"


def test_mlnx_qos_real_dscp_trust() -> None:
    report = qos.mlnx_qos(sample(MLNX_QOS_REAL))
    assert report["trust"] == "dscp"
    assert report["pfc_enabled"] == [3]
    assert report["dscp2prio"] == {dscp: dscp >> 3 for dscp in range(64)}
    assert report["dscp2prio"][26] == 3
    assert report["tc"] == {
        0: {"tsa": "vendor", "bw": None, "priorities": [1]},
        1: {"tsa": "vendor", "bw": None, "priorities": [0]},
        **{tc: {"tsa": "vendor", "bw": None, "priorities": [tc]} for tc in range(2, 8)},
    }


def test_mlnx_qos_with_blank_lines_between_a_tc_and_its_priorities() -> None:
    """The layout ConnectX NICs print (Mellanox's published mlnx_qos sample): every tc keeps
    its priorities, so the ETS checks judge the real map, not an empty one."""
    report = qos.mlnx_qos(sample("mlnx_qos_blank_lines.txt"))
    assert (report["trust"], report["pfc_enabled"]) == ("dscp", [0, 2, 6, 7])
    assert {tc: entry["priorities"] for tc, entry in report["tc"].items()} == {
        0: [1], 1: [0], 2: [2], 3: [3], 4: [4], 5: [5], 6: [6], 7: [7]}
    assert report["tc"][6] == {"tsa": "strict", "bw": None, "priorities": [6]}
    assert [report["tc"][tc]["bw"] for tc in range(8)] == [10, 10, 10, 10, 10, 10, None, 40]


def test_mlnx_qos_last_report_wins() -> None:
    text = sample(MLNX_QOS_REAL)
    head, sep, tail = text.rpartition("enabled     0   0   0   1")
    report = qos.mlnx_qos(head + sep.replace("0   0   0   1", "0   0   1   1") + tail)
    assert report["pfc_enabled"] == [2, 3]


def test_mlnx_qos_current_layout_with_buffers_and_ets() -> None:
    report = qos.mlnx_qos(sample("synthetic_mlnx_qos_buffers_ets.txt"))
    assert report["trust"] == "dscp"
    assert report["pfc_enabled"] == [3]
    expected_map = {dscp: dscp >> 3 for dscp in range(64)}
    expected_map[46] = 3
    assert report["dscp2prio"] == expected_map
    assert report["tc"][0] == {"tsa": "ets", "bw": 13, "priorities": [1]}
    assert report["tc"][1] == {"tsa": "ets", "bw": 13, "priorities": [0]}
    assert [report["tc"][tc]["bw"] for tc in range(8)] == [13, 13, 13, 13, 12, 12, 12, 12]


def test_mlnx_qos_pcp_trust_with_default_priority_and_empty_tcs() -> None:
    report = qos.mlnx_qos(sample("synthetic_mlnx_qos_pcp_trust.txt"))
    assert report == {
        "trust": "pcp",
        "pfc_enabled": [3, 4],
        "dscp2prio": {},
        "tc": {
            0: {"tsa": "ets", "bw": 50, "priorities": [0, 1, 2, 5, 6, 7]},
            1: {"tsa": "vendor", "bw": None, "priorities": []},
            2: {"tsa": "vendor", "bw": None, "priorities": []},
            3: {"tsa": "ets", "bw": 50, "priorities": [3]},
            4: {"tsa": "strict", "bw": None, "priorities": [4]},
            5: {"tsa": "vendor", "bw": None, "priorities": []},
            6: {"tsa": "vendor", "bw": None, "priorities": []},
            7: {"tsa": "vendor", "bw": None, "priorities": []},
        },
    }


def test_mlnx_qos_tc_line_without_ratelimit() -> None:
    text = "Priority trust state: pcp\n\tenabled     0   0   0   0   0   0   0   0\n"
    text += "tc: 0 tsa: ets, bw: 100%\n\t priority:  0\n"
    assert qos.mlnx_qos(text)["tc"] == {0: {"tsa": "ets", "bw": 100, "priorities": [0]}}


def test_mlnx_qos_missing_enabled_row_is_an_error() -> None:
    text = "\n".join(line for line in sample(MLNX_QOS_REAL).splitlines() if "enabled" not in line)
    with pytest.raises(ParseError, match=r"expected a PFC 'enabled' row, got 'DCBX mode"):
        qos.mlnx_qos(text)


@pytest.mark.parametrize(
    "row",
    ["enabled     0   0   x   1   0   0   0   0", "enabled     0   0   0   1", "enabled"],
)
def test_mlnx_qos_garbled_enabled_row_is_an_error(row: str) -> None:
    text = sample("synthetic_mlnx_qos_pcp_trust.txt").replace(
        "enabled     0   0   0   1   1   0   0   0", row
    )
    with pytest.raises(ParseError, match=re.escape(repr(row))):
        qos.mlnx_qos(text)


def test_mlnx_qos_missing_trust_line_is_an_error() -> None:
    text = sample(MLNX_QOS_REAL).replace("Priority trust state: dscp", "")
    with pytest.raises(ParseError, match="Priority trust state"):
        qos.mlnx_qos(text)


def test_mlnx_qos_unsupported_trust_is_an_error() -> None:
    text = sample("synthetic_mlnx_qos_pcp_trust.txt").replace(
        "Priority trust state: pcp", "Priority trust state: none"
    )
    with pytest.raises(ParseError, match=r"'pcp' or 'dscp', got 'Priority trust state: none'"):
        qos.mlnx_qos(text)


def test_mlnx_qos_dscp_on_two_priorities_is_an_error() -> None:
    text = sample("synthetic_mlnx_qos_buffers_ets.txt").replace("dscp:47,45", "dscp:47,46,45")
    with pytest.raises(ParseError, match="dscp 46 mapped to a single priority"):
        qos.mlnx_qos(text)


@pytest.mark.parametrize(
    ("line", "garbled"),
    [
        ("prio:3 dscp:31,30,29,28,27,26,25,24,", "3 dscp:31,30,29,28,27,26,25,24,"),
        ("prio:3 dscp:31,30,29,28,27,26,25,24,", "prio:3 dscp:31,30,2x,28,27,26,25,24,"),
        ("prio:3 dscp:31,30,29,28,27,26,25,24,", "prio:3 ?"),
        ("tc: 2 ratelimit: unlimited, tsa: vendor", "tc: two ratelimit: unlimited, tsa: vendor"),
        ("priority:  6", "priority:  six"),
        ("priority    0   1   2   3", "priority    0   1   x   3"),
    ],
)
def test_mlnx_qos_garbled_map_or_tc_line_is_an_error(line: str, garbled: str) -> None:
    """A line of the dscp map, the PFC header or the tc table that cannot be read is refused:
    skipping it would read a map or a tc without it as the whole answer."""
    text = sample(MLNX_QOS_REAL)
    head, sep, tail = text.rpartition(line)
    with pytest.raises(ParseError, match=re.escape(f"got '{garbled}")):
        qos.mlnx_qos(head + sep.replace(line, garbled) + tail)


def test_mlnx_qos_error_output() -> None:
    with pytest.raises(ParseError, match="'Interface name is required'"):
        qos.mlnx_qos("Interface name is required\nUsage: mlnx_qos -i <interface> [options]\n")


# --------------------------------------------------------------------------- dcb pfc


def test_dcb_pfc_man_page_example() -> None:
    assert qos.dcb_pfc(sample("dcb_pfc_show_manpage.txt")) == {
        "pfc_cap": 8,
        "macsec_bypass": False,
        "delay": 4096,
        "prio_pfc": [6, 7],
    }


STATS_EXPECTED = {
    "pfc_cap": 8,
    "macsec_bypass": False,
    "delay": 0,
    "prio_pfc": [3],
    "requests": {0: 0, 1: 0, 2: 0, 3: 1523, 4: 0, 5: 0, 6: 0, 7: 0},
    "indications": {0: 0, 1: 0, 2: 0, 3: 8791, 4: 0, 5: 0, 6: 0, 7: 0},
}


def test_dcb_pfc_with_statistics() -> None:
    assert qos.dcb_pfc(sample("synthetic_dcb_pfc_show_stats.txt")) == STATS_EXPECTED


def test_dcb_pfc_without_macsec_bypass() -> None:
    text = "pfc-cap 8 delay 0 \nprio-pfc 0:on 1:off 2:off 3:on 4:off 5:off 6:off 7:off \n"
    assert qos.dcb_pfc(text) == {"pfc_cap": 8, "delay": 0, "prio_pfc": [0, 3]}


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("Attribute not found: No such file or directory\n", "'Attribute not found: No such"),
        ("prio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off\n", "'prio-pfc 0:off"),
        ("", "empty output"),
    ],
)
def test_dcb_pfc_missing_fields(text: str, quoted: str) -> None:
    with pytest.raises(ParseError, match=r"dcb pfc: expected fields .*got " + re.escape(quoted)):
        qos.dcb_pfc(text)


@pytest.mark.parametrize(
    "bad_line",
    [
        "prio-pfc 0:off 1:off 2:off 3:maybe 4:off 5:off 6:off 7:off",
        "prio-pfc 0:off 1:off 2:off 3:on",
        "prio-pfc all:on",
        "pfc-cap 8 macsec-bypass off delay",
        "pfc-cap eight macsec-bypass off delay 0",
    ],
)
def test_dcb_pfc_garbled_lines(bad_line: str) -> None:
    good = sample("synthetic_dcb_pfc_show_stats.txt")
    first = "prio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off "
    target = first if bad_line.startswith("prio-pfc") else "pfc-cap 8 macsec-bypass off delay 0 "
    with pytest.raises(ParseError, match=re.escape(repr(bad_line))):
        qos.dcb_pfc(good.replace(target, bad_line))


def test_dcb_pfc_json_matches_text_output() -> None:
    assert qos.dcb_pfc_json(sample("synthetic_dcb_pfc_json.txt")) == STATS_EXPECTED


def test_dcb_pfc_json_pretty_and_alternative_prio_forms() -> None:
    pretty = """{
    "pfc_cap": 8,
    "macsec_bypass": true,
    "delay": 4096,
    "prio_pfc": [{"0": false}, {"1": false}, {"2": false}, {"3": false},
                 {"4": false}, {"5": false}, {"6": true}, {"7": true}],
    "requests": {"0": 0, "1": 0, "2": 0, "3": 0, "4": 0, "5": 0, "6": 12, "7": 0}
}
"""
    assert qos.dcb_pfc_json(pretty) == {
        "pfc_cap": 8,
        "macsec_bypass": True,
        "delay": 4096,
        "prio_pfc": [6, 7],
        "requests": {0: 0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 12, 7: 0},
    }


def test_dcb_pfc_json_object_keyed_by_priority() -> None:
    text = '{"pfc_cap":8,"delay":0,"prio_pfc":{"0":"off","1":"off","2":"off","3":"on",'
    text += '"4":"off","5":"off","6":"off","7":"off"}}'
    assert qos.dcb_pfc_json(text) == {"pfc_cap": 8, "delay": 0, "prio_pfc": [3]}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Attribute not found: No such file or directory\n", "a JSON document"),
        ('{"pfc_cap":8,"delay":0\n', "valid JSON"),
        ('{"pfc_cap":8,"macsec_bypass":false,"delay":0}', "keys prio_pfc"),
        (
            '{"pfc_cap":"8","delay":0,"prio_pfc":[false,false,false,false,false,false,false,false]}',
            "an integer for pfc_cap",
        ),
        ('{"pfc_cap":8,"delay":0,"prio_pfc":[false,false,true]}', "one value for each priority"),
        ('{"pfc_cap":8,"delay":0,"prio_pfc":[0,0,0,1,0,0,0,0]}', "true/false or on/off"),
    ],
)
def test_dcb_pfc_json_errors(text: str, expected: str) -> None:
    with pytest.raises(ParseError, match=expected):
        qos.dcb_pfc_json(text)


# --------------------------------------------------------------------------- nccl-tests

NCCL_REAL = "nccl_tests_all_reduce_current_format.txt"


def test_nccl_tests_current_format() -> None:
    rows = nccl_tests.nccl_tests(sample(NCCL_REAL))
    assert [row["size"] for row in rows] == [2097152, 4194304, 8388608, 16777216, 33554432]
    assert rows[0] == {
        "size": 2097152,
        "count": 524288,
        "type": "float",
        "redop": "sum",
        "root": -1,
        "out_of_place": {"time_us": 113.2, "algbw": 18.53, "busbw": 18.53, "wrong": 0},
        "in_place": {"time_us": 93.35, "algbw": 22.46, "busbw": 22.46, "wrong": 0},
    }
    assert rows[-1]["in_place"]["busbw"] == 41.52
    assert nccl_tests.nccl_tests_avg_busbw(sample(NCCL_REAL)) is None


def nccl(name: str) -> str:
    return (FIXTURES / "nccl" / name).read_text()


def test_nccl_tests_mpirun_tag_output() -> None:
    """A 16-rank run under ``mpirun --tag-output`` (NCCL 2.9.9, EFA): every line carries
    ``[1,R]<stdout>:`` and the NCCL INFO lines of other ranks fall between the header and
    the rows."""
    text = nccl("nccl-tests-all-reduce-tag-output-p4d-efa.txt")
    rows = nccl_tests.nccl_tests(text)
    assert [row["size"] for row in rows] == [2**k for k in range(3, 33)]
    assert {(row["type"], row["redop"], row["root"]) for row in rows} == {("float", "sum", None)}
    assert rows[0]["out_of_place"] == {
        "time_us": 179.1, "algbw": 0.0, "busbw": 0.0, "wrong": None, "error": 2e-07}
    assert rows[-1]["in_place"]["busbw"] == 43.72
    assert nccl_tests.nccl_tests_avg_busbw(text) == 11.2432


def test_nccl_tests_tag_output_behind_a_launcher_prefix() -> None:
    """SkyPilot prints its own ``(head, rank=0, pid=N)`` before mpirun's tag (current layout,
    all_gather on 16 H200)."""
    text = nccl("nccl-tests-all-gather-skypilot-h200-gke.txt")
    rows = nccl_tests.nccl_tests(text)
    assert [row["size"] for row in rows] == [1024, 2048, 1048576, 16777216, 2**32, 2**33]
    assert {(row["redop"], row["root"]) for row in rows} == {("none", -1)}
    assert rows[-1]["in_place"] == {"time_us": 24214.0, "algbw": 354.75, "busbw": 332.58,
                                    "wrong": 0}
    assert nccl_tests.nccl_tests_avg_busbw(text) == 122.073


@pytest.mark.parametrize(
    ("test", "redop", "root", "avg"),
    [
        ("all_gather_perf", None, None, 30.2993),
        ("all_reduce_perf", "sum", None, 42.5578),
        ("broadcast_perf", None, 0, 41.2456),
        ("reduce_perf", "sum", 0, 41.3386),
        ("reduce_scatter_perf", "sum", None, 20.3609),
    ],
)
def test_nccl_tests_older_layouts_without_redop_or_root(
    test: str, redop: str | None, root: int | None, avg: float
) -> None:
    """nccl-tests 2.0 on a DGX-2: all_gather printed neither ``redop`` nor ``root``,
    broadcast ``root`` alone, all_reduce ``redop`` alone."""
    runs = nccl("nccl-tests-dgx2-v100-five-collectives.txt").split("Running: ")[1:]
    text = next(run for run in runs if f"./build/{test} " in run)
    rows = nccl_tests.nccl_tests(text)
    assert len(rows) == 31
    assert {(row["redop"], row["root"]) for row in rows} == {(redop, root)}
    assert rows[-1]["size"] in (8589934592, 8589934560)
    assert nccl_tests.nccl_tests_avg_busbw(text) == avg


def test_nccl_tests_older_all_gather_reports_its_errors() -> None:
    runs = nccl("nccl-tests-dgx2-v100-five-collectives.txt").split("Running: ")
    rows = nccl_tests.nccl_tests(runs[1])
    assert rows[-1]["out_of_place"] == {
        "time_us": 106773.0, "algbw": 73.75, "busbw": 73.75, "wrong": None, "error": 1.0}


def test_nccl_tests_legacy_error_column() -> None:
    text = sample("synthetic_nccl_tests_legacy_error_column.txt")
    rows = nccl_tests.nccl_tests(text)
    assert len(rows) == 8
    assert rows[0] == {
        "size": 1048576,
        "count": 262144,
        "type": "float",
        "redop": "sum",
        "root": None,
        "out_of_place": {
            "time_us": 68.52,
            "algbw": 15.30,
            "busbw": 26.78,
            "wrong": None,
            "error": 1e-07,
        },
        "in_place": {
            "time_us": 67.91,
            "algbw": 15.44,
            "busbw": 27.02,
            "wrong": None,
            "error": 1e-07,
        },
    }
    assert rows[-1]["size"] == 134217728
    assert rows[-1]["out_of_place"]["time_us"] == 3571.6
    assert rows[-1]["in_place"]["error"] == 2e-07
    assert nccl_tests.nccl_tests_avg_busbw(text) == 51.689


def test_nccl_tests_broadcast_without_validation() -> None:
    text = sample("synthetic_nccl_tests_broadcast_no_check.txt")
    rows = nccl_tests.nccl_tests(text)
    assert [row["size"] for row in rows] == [4**k * 1048576 for k in range(6)]
    assert {(row["redop"], row["root"]) for row in rows} == {("none", 0)}
    assert rows[-1]["out_of_place"] == {
        "time_us": 3903.2,
        "algbw": 275.09,
        "busbw": 275.09,
        "wrong": None,
    }
    assert nccl_tests.nccl_tests_avg_busbw(text) == 170.72


def test_nccl_tests_wrong_count_in_g_format() -> None:
    text = sample(NCCL_REAL).replace(
        "  113.2   18.53   18.53      0", "  113.2   18.53   18.53  1.2e+06"
    )
    assert nccl_tests.nccl_tests(text)[0]["out_of_place"]["wrong"] == 1200000


def test_nccl_tests_timestamp_column_is_ignored() -> None:
    header = "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    header += "     time   algbw   busbw #wrong timestamp\n"
    row = "     2097152        524288     float     sum      -1    113.2   18.53   18.53      0"
    row += "    93.35   22.46   22.46      0 2025-11-30 03:24:31\n"
    assert nccl_tests.nccl_tests(header + row)[0]["in_place"]["wrong"] == 0


def test_nccl_tests_without_rows_is_an_error() -> None:
    text = "\n".join(sample(NCCL_REAL).splitlines()[:8])
    with pytest.raises(ParseError, match="at least one result row"):
        nccl_tests.nccl_tests(text)
    with pytest.raises(ParseError, match="NCCL WARN"):
        nccl_tests.nccl_tests("node1:123:456 [0] NCCL WARN NET/IB : Got async event : port error\n")


def test_nccl_tests_row_before_header_is_an_error() -> None:
    rows_only = [line for line in sample(NCCL_REAL).splitlines() if not line.startswith("#")]
    with pytest.raises(ParseError, match=r"header before data, got '2097152"):
        nccl_tests.nccl_tests("\n".join(rows_only))


def test_nccl_tests_truncated_row_is_an_error() -> None:
    truncated = "    67108864      16777216     float     sum      -1\n"
    text = sample(NCCL_REAL).rstrip("\n") + "\n" + truncated
    with pytest.raises(ParseError, match=r"13 columns, got '67108864"):
        nccl_tests.nccl_tests(text)


@pytest.mark.parametrize(
    ("row", "garbled"),
    [
        ("     2097152        524288", "           :        524288"),
        ("     2097152        524288", "     2097152        52428x"),
    ],
)
def test_nccl_tests_row_with_garbled_size_or_count_is_an_error(row: str, garbled: str) -> None:
    """A row whose size or count cannot be read is refused, not skipped as if the run had
    not reached that size."""
    text = sample(NCCL_REAL).replace(row, garbled)
    with pytest.raises(ParseError, match="expected an integer"):
        nccl_tests.nccl_tests(text)


def test_nccl_tests_unknown_header_is_an_error() -> None:
    text = sample(NCCL_REAL).replace("#wrong     time", "#oops     time")
    with pytest.raises(ParseError, match=re.escape("#wrong|error for both halves")):
        nccl_tests.nccl_tests(text)


def test_nccl_tests_avg_busbw_garbled() -> None:
    with pytest.raises(ParseError, match="a number"):
        nccl_tests.nccl_tests_avg_busbw("# Avg bus bandwidth    : fast\n")


# --------------------------------------------------------------------------- nvidia-smi


def test_nvidia_smi_query_h200() -> None:
    rows = nvidia_smi.nvidia_smi_query(h200("query_gpu_csv.txt"))
    assert len(rows) == 2
    assert rows[0] == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-b3326c09-b792-6c46-c09e-1b0f8a6947c6",
        "pci.bus_id": "00000000:00:06.0",
        "driver_version": "580.159.04",
        "memory.total": 143771,
        "pcie.link.gen.current": 5,
        "pcie.link.gen.max": 5,
        "pcie.link.width.current": 16,
        "pcie.link.width.max": 16,
        "temperature.gpu": 31,
        "power.draw": 95.25,
        "power.limit": 700.0,
        "clocks.current.sm": 345,
        "clocks.max.sm": 1980,
        "persistence_mode": True,
        "clocks_event_reasons.active": 1,
        "clocks_event_reasons.hw_slowdown": False,
        "clocks_event_reasons.hw_thermal_slowdown": False,
        "clocks_event_reasons.hw_power_brake_slowdown": False,
        "clocks_event_reasons.sw_thermal_slowdown": False,
        "clocks_event_reasons.sw_power_cap": False,
        "ecc.mode.current": True,
        "ecc.errors.uncorrected.volatile.total": 0,
        "ecc.errors.uncorrected.aggregate.total": 0,
        "remapped_rows.pending": False,
        "remapped_rows.failure": False,
        "compute_cap": 9.0,
    }
    assert rows[1]["uuid"] == "GPU-d8eb21c2-9910-0161-42ef-1289f347dddc"
    assert rows[1]["power.draw"] == 82.13


def test_nvidia_smi_query_throttle_subset() -> None:
    assert nvidia_smi.nvidia_smi_query(h200("query_gpu_throttle.txt")) == [
        {"index": 0, "clocks_event_reasons.active": 1, "clocks_event_reasons.hw_slowdown": False},
        {"index": 1, "clocks_event_reasons.active": 1, "clocks_event_reasons.hw_slowdown": False},
    ]


def test_nvidia_smi_query_legacy_throttle_names_and_not_available() -> None:
    rows = nvidia_smi.nvidia_smi_query(sample("synthetic_query_gpu_legacy_throttle_na.txt"))
    assert rows[1] == {
        "index": 1,
        "name": "Tesla T4",
        "clocks_event_reasons.active": 0x20,
        "clocks_event_reasons.hw_slowdown": False,
        "clocks_event_reasons.hw_thermal_slowdown": True,
        "power.draw": 69.12,
        "fan.speed": None,
        "mig.mode.current": None,
        "ecc.errors.uncorrected.volatile.total": 0,
        "remapped_rows.pending": None,
        "pci.device_id": 0x1EB810DE,
        "serial": "1322120012346",
        "vbios_version": "90.04.96.00.02",
    }


def test_nvidia_smi_query_not_supported_and_no_devices() -> None:
    text = "index, pcie.link.gen.gpucurrent, retired_pages.pending\n0, [Not Supported], Yes\n"
    assert nvidia_smi.nvidia_smi_query(text) == [
        {"index": 0, "pcie.link.gen.gpucurrent": None, "retired_pages.pending": True}
    ]
    assert nvidia_smi.nvidia_smi_query("No devices were found\n") == []
    assert nvidia_smi.nvidia_smi_list("No devices were found\n") == []
    assert nvidia_smi.nvidia_smi_query("index, name\n") == []


def test_nvidia_smi_query_without_header_is_an_error() -> None:
    with pytest.raises(ParseError, match=r"header line of field names, got '0, NVIDIA H200"):
        nvidia_smi.nvidia_smi_query(h200("query_gpu_csv_noheader.txt"))


def test_nvidia_smi_query_driver_failure() -> None:
    text = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n\n"
    )
    with pytest.raises(ParseError, match='got "NVIDIA-SMI has failed because'):
        nvidia_smi.nvidia_smi_query(text)
    with pytest.raises(ParseError, match="a CSV header line, got empty output"):
        nvidia_smi.nvidia_smi_query("")


def test_nvidia_smi_query_column_mismatch() -> None:
    text = h200("query_gpu_throttle.txt").replace("0, 0x0000000000000001, Not Active", "0, 0x1")
    with pytest.raises(ParseError, match=r"3 comma-separated values, got '0, 0x1'"):
        nvidia_smi.nvidia_smi_query(text)


def test_nvidia_topo_h200() -> None:
    assert nvidia_smi.nvidia_topo(h200("topo_m.txt")) == {
        "gpus": ["GPU0", "GPU1"],
        "matrix": {"GPU0": {"GPU0": "X", "GPU1": "NV18"}, "GPU1": {"GPU0": "NV18", "GPU1": "X"}},
        "cpu_affinity": {"GPU0": "0-31", "GPU1": "0-31"},
        "numa_affinity": {"GPU0": "0", "GPU1": "0"},
        "nics": {},
    }


def test_nvidia_topo_without_ansi_codes() -> None:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", h200("topo_m.txt"))
    assert nvidia_smi.nvidia_topo(plain) == nvidia_smi.nvidia_topo(h200("topo_m.txt"))


def test_nvidia_topo_eight_gpus_with_nics() -> None:
    topo = nvidia_smi.nvidia_topo(sample("synthetic_topo_m_8gpu_nics.txt"))
    gpus = [f"GPU{i}" for i in range(8)]
    nics = [f"NIC{i}" for i in range(10)]
    assert topo["gpus"] == gpus
    assert list(topo["matrix"]) == gpus + nics
    matrix = topo["matrix"]
    assert all(matrix[a][b] == "NV18" for a in gpus for b in gpus if a != b)
    assert all(matrix[name][name] == "X" for name in gpus + nics)
    assert all(matrix[a][b] == matrix[b][a] for a in matrix for b in matrix)
    assert matrix["GPU0"]["NIC0"] == "PIX"
    assert matrix["GPU0"]["NIC1"] == "NODE"
    assert matrix["GPU0"]["NIC4"] == "SYS"
    assert matrix["NIC8"]["NIC9"] == "PIX"
    assert topo["cpu_affinity"] == {
        **{f"GPU{i}": "0-55,112-167" for i in range(4)},
        **{f"GPU{i}": "56-111,168-223" for i in range(4, 8)},
    }
    assert topo["numa_affinity"] == {f"GPU{i}": str(i // 4) for i in range(8)}
    assert topo["nics"] == {f"NIC{i}": f"mlx5_{i}" for i in range(10)}


def test_nvidia_topo_not_applicable_affinity() -> None:
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \tN/A\tN/A\t\tN/A\n"
    topo = nvidia_smi.nvidia_topo(text)
    assert topo["cpu_affinity"] == {"GPU0": None}
    assert topo["numa_affinity"] == {"GPU0": None}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
            "a header row of GPU columns",
        ),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \n", "a row with 2 device cells"),
        ("\tGPU0\tGPU1\tCPU Affinity\nGPU9\t X \tNV18\t0-31\n", "a row with 2 device cells"),
        ("\tGPU0\tCPU Affinity\nGPU0\t X \t0-31\t0\n", "at most 1 affinity fields"),
        ("\tGPU0\tGPU1\n\nLegend:\n", "matrix rows after the header"),
    ],
)
def test_nvidia_topo_errors(text: str, expected: str) -> None:
    with pytest.raises(ParseError, match=expected):
        nvidia_smi.nvidia_topo(text)


def test_nvlink_status_h200() -> None:
    assert nvidia_smi.nvlink_status(h200("nvlink_status.txt")) == {
        0: [26.562] * 18,
        1: [26.562] * 18,
    }


def test_nvlink_status_inactive_links() -> None:
    links = nvidia_smi.nvlink_status(sample("synthetic_nvlink_status_inactive.txt"))
    assert links[0] == [None if i in (3, 11) else 26.562 for i in range(18)]
    assert links[1] == [26.562] * 18
    assert links[2] == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("No devices were found\n", "'GPU N:' or 'Link N:' lines, got 'No devices were found'"),
        ("\t Link 0: 26.562 GB/s\n", "under a GPU line"),
        ("GPU 0: NVIDIA H200 (UUID: x)\n\t Link 1: 26.562 GB/s\n", "numbered from 0"),
        ("GPU 0: NVIDIA H200 (UUID: x)\n\t Link 0: fast\n", "'N GB/s' or '<inactive>'"),
    ],
)
def test_nvlink_status_errors(text: str, expected: str) -> None:
    with pytest.raises(ParseError, match=re.escape(expected)):
        nvidia_smi.nvlink_status(text)


# --------------------------------------------------------------------------- versions


def test_proc_driver_version_open_and_proprietary() -> None:
    assert system.proc_driver_version(h200("proc_nvidia_version.txt")) == "580.159.04"
    text = sample("synthetic_proc_driver_version_proprietary.txt")
    assert system.proc_driver_version(text) == "550.127.05"


def test_proc_driver_version_missing_module() -> None:
    text = "cat: /proc/driver/nvidia/version: No such file or directory\n"
    with pytest.raises(ParseError, match="'cat: /proc/driver/nvidia/version"):
        system.proc_driver_version(text)


def test_cuda_version_json() -> None:
    assert cuda.cuda_version_json(sample("synthetic_cuda_version_json.txt")) == "12.4.1"


@pytest.mark.parametrize(
    "text",
    [
        "cat: /usr/local/cuda/version.json: No such file or directory\n",
        '{"cuda_cccl": {"version": "12.4.127"}}',
        '{"cuda": {"name": "CUDA SDK"',
    ],
)
def test_cuda_version_json_errors(text: str) -> None:
    with pytest.raises(ParseError, match=re.escape("cuda version.json: expected")):
        cuda.cuda_version_json(text)


def test_nvcc_version() -> None:
    assert cuda.nvcc_version(h200("nvcc_version.txt")) == "13.0.88"
    with pytest.raises(ParseError, match="'bash: nvcc: command not found'"):
        cuda.nvcc_version("bash: nvcc: command not found\n")


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("nvcc-version-12.5-hello-ai.txt", "12.5.82"),
        ("nvcc-version-11.1-pytorch-builder-580.txt", "11.1.105"),
        ("nvcc-version-11.0-pytorch-builder-580.txt", "11.0.221"),
        ("nvcc-version-10.1-k2-584.txt", "10.1.243"),
        ("nvcc-version-7.5-nvbio-18.txt", "7.5.17"),
    ],
)
def test_nvcc_version_published_toolkits(name: str, version: str) -> None:
    """CUDA 7.5 to 12.5: with and without the ``Build cuda_...`` line, and behind a
    ``$ nvcc --version`` prompt (published/README.md)."""
    assert cuda.nvcc_version(published(name)) == version


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("550.127.05-0ubuntu1", "550.127.05"),
        ("580.95.05-0ubuntu1", "580.95.05"),
        ("1:550.54.15-1", "550.54.15"),
        ("535.183.01-0ubuntu0.22.04.1", "535.183.01"),
        ("2.28.3-1+cuda13.0", "2.28.3"),
        ("550.54.15", "550.54.15"),
    ],
)
def test_nvidia_version_from_package(version: str, expected: str) -> None:
    assert packages.nvidia_version_from_package(version) == expected


@pytest.mark.parametrize("version", ["", "none", "v550", "550"])
def test_nvidia_version_from_package_errors(version: str) -> None:
    with pytest.raises(ParseError, match="package version: expected"):
        packages.nvidia_version_from_package(version)


def test_torch_info_h200() -> None:
    assert cuda.torch_info(h200("torch_versions.txt")) == {
        "python": "3.12.3",
        "torch": "2.11.0+cu130",
        "cuda": "13.0",
        "nccl": "2.28.9",
        "cudnn": 91900,
        "device_count": 2,
        "devices": ["NVIDIA H200", "NVIDIA H200"],
    }


def test_torch_info_after_warning_lines() -> None:
    text = "[W1130 03:24:31.000000000 socket.cpp:755] [c10d] warning\n" + h200("torch_versions.txt")
    assert cuda.torch_info(text)["torch"] == "2.11.0+cu130"


def test_torch_info_traceback() -> None:
    with pytest.raises(ParseError, match="ModuleNotFoundError: No module named 'torch'"):
        cuda.torch_info(sample("synthetic_torch_missing.txt"))
    with pytest.raises(ParseError, match="'torch' key"):
        cuda.torch_info('{"python": "3.12.3"}\n')


# --------------------------------------------------------------------------- OS facts


def test_os_release_h200() -> None:
    release = system.os_release(h200("os_release.txt"))
    assert release["PRETTY_NAME"] == "Ubuntu 24.04.3 LTS"
    assert release["VERSION_ID"] == "24.04"
    assert release["VERSION"] == "24.04.3 LTS (Noble Numbat)"
    assert release["ID"] == "ubuntu"
    assert release["VERSION_CODENAME"] == "noble"
    assert release["HOME_URL"] == "https://www.ubuntu.com/"
    assert len(release) == 13


def published(name: str) -> str:
    return (FIXTURES / "published" / name).read_text()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("os-release-debian13.txt", ("debian", "13", "trixie")),
        ("os-release-ubuntu16.txt", ("ubuntu", "16.04", None)),
        ("os-release-rhel9.txt", ("rhel", "9.6", None)),
        ("os-release-amazon2023.txt", ("amzn", "2023", None)),
    ],
)
def test_os_release_published_distributions(name: str, expected: tuple[str, str, str | None]
                                            ) -> None:
    """Real os-release files of Debian, Ubuntu, RHEL (a blank line inside) and Amazon Linux."""
    release = system.os_release(published(name))
    assert (release["ID"], release["VERSION_ID"], release.get("VERSION_CODENAME")) == expected
    assert '"' not in release["PRETTY_NAME"]


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("ofed-info-s-mlnx-ofed-23.07-connectx5.txt", "23.07-0.5.1.2"),
        ("ofed-info-s-doca-24.07-connectx7.txt", "24.07-0.3.5.0.110"),
    ],
)
def test_ofed_version_published_hosts(name: str, version: str) -> None:
    assert packages.ofed_version(published(name)) == version


def test_os_release_quoting_and_comments() -> None:
    text = '# generated\nNAME=\'Rocky Linux\'\nVARIANT="Cloud \\"edition\\" \\$1"\n\nID=rocky\n'
    assert system.os_release(text) == {
        "NAME": "Rocky Linux",
        "VARIANT": 'Cloud "edition" $1',
        "ID": "rocky",
    }


def test_os_release_errors() -> None:
    with pytest.raises(ParseError, match="'cat: /etc/os-release: No such file"):
        system.os_release("cat: /etc/os-release: No such file or directory\n")
    with pytest.raises(ParseError, match="empty output"):
        system.os_release("")


def test_meminfo_h200() -> None:
    info = system.meminfo(h200("meminfo.txt"))
    assert info["MemTotal"] == 263998500 * 1024
    assert info["Active(anon)"] == 48 * 1024
    assert info["Hugepagesize"] == 2048 * 1024
    assert info["HugePages_Total"] == 0
    assert len(info) == len(h200("meminfo.txt").splitlines())


@pytest.mark.parametrize(
    ("name", "fields", "total_kb", "available_kb"),
    [
        ("meminfo-node-procfs-stats-issue9.txt", 43, 1019732, 710280),
        ("meminfo-node-exporter.txt", 42, 3742148, None),
        ("meminfo-openvz-wp-server-stats-issue3.txt", 21, 5683284, None),
    ],
)
def test_meminfo_published_kernels(name: str, fields: int, total_kb: int,
                                   available_kb: int | None) -> None:
    """Kernels with and without MemAvailable (3.14+ and older), and an OpenVZ container that
    shows only 21 fields (published/README.md)."""
    info = system.meminfo(published(name))
    assert len(info) == fields
    assert info["MemTotal"] == total_kb * 1024
    assert info.get("MemAvailable") == (available_kb * 1024 if available_kb else None)


def test_meminfo_errors() -> None:
    with pytest.raises(ParseError, match="'MemTotal 12 GB'"):
        system.meminfo("MemTotal 12 GB\n")
    with pytest.raises(ParseError, match="a MemTotal line"):
        system.meminfo("MemFree:  10 kB\n")


def test_ip_addr_json() -> None:
    assert network.ip_addr_json(sample("synthetic_ip_j_addr.txt")) == [
        {
            "name": "lo",
            "mtu": 65536,
            "state": "UNKNOWN",
            "mac": "00:00:00:00:00:00",
            "addresses": ["127.0.0.1/8", "::1/128"],
        },
        {
            "name": "eno1",
            "mtu": 1500,
            "state": "UP",
            "mac": "3c:ec:ef:12:34:56",
            "addresses": ["10.20.0.17/24", "fe80::3eec:efff:fe12:3456/64"],
        },
        {
            "name": "ens1np0",
            "mtu": 9000,
            "state": "UP",
            "mac": "b8:3f:d2:aa:bb:01",
            "addresses": ["192.168.100.17/24", "fd00:100::17/64"],
        },
        {
            "name": "docker0",
            "mtu": 1500,
            "state": "DOWN",
            "mac": "02:42:5e:1c:0a:7b",
            "addresses": ["172.17.0.1/16"],
        },
        {"name": "tun0", "mtu": 1500, "state": "UNKNOWN", "mac": None, "addresses": []},
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bash: ip: command not found\n", "a JSON document"),
        ('{"ifname": "lo"}\n', "a JSON document"),
        ('[{"ifindex": 1}]\n', "interfaces with ifname and mtu"),
    ],
)
def test_ip_addr_json_errors(text: str, expected: str) -> None:
    with pytest.raises(ParseError, match=expected):
        network.ip_addr_json(text)


def test_ip_addr_json_ipoib_links_with_20_byte_addresses() -> None:
    """Eight IPoIB ports of a GPU node as iproute2 prints them (link_type infiniband, MTU 2044,
    a 20-byte hardware address, no addr_info): each is kept, with no address."""
    links = network.ip_addr_json(published("ip-j-link-ipoib-8x-gcm.txt"))
    assert [link["name"] for link in links] == [
        "ibp12s0", "ibp18s0", "ibp75s0", "ibp84s0", "ibp141s0", "ibp148s0", "ibp186s0",
        "ibp204s0"]
    assert {(link["mtu"], link["state"], len(link["mac"].split(":")), len(link["addresses"]))
            for link in links} == {(2044, "UP", 20, 0)}


def test_sys_class_net_fallback() -> None:
    interfaces = network.sys_class_net(sample("synthetic_sys_class_net.txt"))
    assert [item["name"] for item in interfaces] == ["docker0", "eno1", "ens1np0", "lo", "tun0"]
    assert interfaces[2] == {
        "name": "ens1np0",
        "mtu": 9000,
        "state": "UP",
        "mac": "b8:3f:d2:aa:bb:01",
        "addresses": [],
    }
    assert interfaces[4] == {
        "name": "tun0",
        "mtu": 1500,
        "state": "UNKNOWN",
        "mac": None,
        "addresses": [],
    }


def test_sys_class_net_errors() -> None:
    with pytest.raises(ParseError, match="'eno1 up 1500'"):
        network.sys_class_net("eno1 up 1500\n")


def test_sysctl_value() -> None:
    assert network.sysctl_value("32768\t60999\n") == "32768 60999"
    assert network.sysctl_value("4096 \t 131072\t6291456\n") == "4096 131072 6291456"
    assert network.sysctl_value("1\n") == "1"
    with pytest.raises(ParseError, match="'sysctl: cannot stat /proc/sys/net/ipv4/nope"):
        network.sysctl_value("sysctl: cannot stat /proc/sys/net/ipv4/nope: No such file\n")
    with pytest.raises(ParseError, match="'cat: /proc/sys/net/ipv4/nope: No such file"):
        network.sysctl_value("cat: /proc/sys/net/ipv4/nope: No such file or directory\n")


def test_port_range() -> None:
    assert network.port_range(h200("port_range.txt")) == (32768, 60999)
    assert network.port_range("32768\t60999\n") == (32768, 60999)
    assert network.port_range("net.ipv4.ip_local_port_range=1024 65000") == (1024, 65000)


@pytest.mark.parametrize("text", ["", "32768\n", "60999 32768\n", "0 100\n", "1024 70000\n"])
def test_port_range_errors(text: str) -> None:
    with pytest.raises(ParseError, match="ip_local_port_range: expected"):
        network.port_range(text)


# --------------------------------------------------------------------------- packages


def test_dpkg_query_h200() -> None:
    listed = packages.dpkg_query(h200("dpkg_nv.txt"))
    assert len(listed) == 38
    assert listed["libnccl2"] == {
        "version": "2.28.3-1+cuda13.0",
        "status": "hold ok installed",
        "installed": True,
        "hold": True,
    }
    assert listed["cuda-nvcc-13-0"] == {
        "version": "13.0.88-1",
        "status": "install ok installed",
        "installed": True,
        "hold": False,
    }
    held = {name for name, info in listed.items() if info["hold"]}
    assert held == {"libcudnn9-cuda-13", "libnccl-dev", "libnccl2"}
    assert listed["openssh-client"]["version"] == "1:9.6p1-3ubuntu13.20"


def test_dpkg_query_states() -> None:
    listed = packages.dpkg_query(sample("synthetic_dpkg_query_states.txt"))
    assert set(listed) == {
        "nvidia-driver-550",
        "nvidia-driver-535",
        "libnvidia-compute-550:amd64",
        "nvidia-fabricmanager-550",
        "cuda-drivers",
    }
    assert listed["nvidia-driver-535"] == {
        "version": "535.183.01-0ubuntu0.22.04.1",
        "status": "deinstall ok config-files",
        "installed": False,
        "hold": False,
    }
    assert listed["cuda-drivers"] == {
        "version": None,
        "status": "unknown ok not-installed",
        "installed": False,
        "hold": False,
    }
    assert listed["nvidia-fabricmanager-550"]["hold"] is True


def test_dpkg_query_on_a_h200_machine_with_holds_and_absent_names() -> None:
    """The gatherer's dpkg-query over globs on a real H200 machine: notices for globs that
    match nothing, ``unknown ok not-installed`` rows without a version, and three holds."""
    listed = packages.dpkg_query(published("dpkg-query-h200-vm-holds.txt"))
    assert len(listed) == 21
    assert {name for name, info in listed.items() if info["hold"]} == {
        "libcudnn9-cuda-13", "libnccl-dev", "libnccl2"}
    assert listed["cuda-nvcc-13"] == {"version": None, "status": "unknown ok not-installed",
                                        "installed": False, "hold": False}
    assert listed["cuda-nvcc-13-0"]["version"] == "13.0.88-1"
    assert listed["python3"]["installed"] is True


def test_dpkg_query_errors() -> None:
    with pytest.raises(ParseError, match="'dpkg-query: error: --show needs"):
        packages.dpkg_query("dpkg-query: error: --show needs a valid format\n")
    with pytest.raises(ParseError, match=re.escape("'libnccl2 2.28.3-1 install ok installed'")):
        packages.dpkg_query("libnccl2 2.28.3-1 install ok installed\n")


def test_apt_showhold() -> None:
    assert packages.apt_showhold(sample("synthetic_apt_showhold.txt")) == {
        "libcudnn9-cuda-13",
        "libnccl-dev",
        "libnccl2",
        "nvidia-driver-550",
    }
    assert packages.apt_showhold("") == set()
    with pytest.raises(ParseError, match="'E: Could not open lock file"):
        packages.apt_showhold("E: Could not open lock file /var/lib/dpkg/lock-frontend\n")


def test_apt_showhold_on_a_h200_machine_and_an_armbian_board() -> None:
    assert packages.apt_showhold(published("apt-mark-showhold-h200-vm.txt")) == {
        "libcublas-13-0", "libcublas-dev-13-0", "libcudnn9-cuda-13", "libnccl-dev", "libnccl2"}
    assert packages.apt_showhold(published("apt-mark-showhold-armbian-connectbox-218.txt")) == {
        "linux-dtb-dev-sun8i", "linux-image-dev-sun8i", "linux-u-boot-nanopineo-dev"}


def test_apt_madison_of_debian_8_with_a_sources_line() -> None:
    """Debian 8 with deb-src enabled: madison adds the source package's line (``... Sources``),
    here of the same version, which is listed once."""
    assert packages.apt_madison(published("apt-cache-madison-debian8-vpenso-scripts-2.txt")) == {
        "bash": ["4.3-11+deb8u1"]}


def test_apt_madison() -> None:
    assert packages.apt_madison(sample("synthetic_apt_madison.txt")) == {
        "cuda-drivers": ["580.95.05-0ubuntu1", "580.82.07-0ubuntu1", "575.57.08-0ubuntu1"],
        "libnccl2": ["2.28.3-1+cuda13.0", "2.28.3-1+cuda12.9", "2.27.7-1+cuda13.0"],
    }
    with pytest.raises(ParseError, match="'E: The package lists or status file"):
        packages.apt_madison("E: The package lists or status file could not be parsed or opened.\n")


# --------------------------------------------------------------------------- health


@pytest.mark.parametrize(
    ("name", "tcp", "udp_fields"),
    [
        ("proc-net-snmp-hiboma-td-agent.txt",
         {"RetransSegs": 5333, "OutSegs": 1558305981, "InErrs": 0, "MaxConn": -1}, 6),
        ("proc-net-snmp-node-exporter.txt",
         {"RetransSegs": 227, "OutSegs": 54915039, "InCsumErrors": 0, "MaxConn": -1}, 7),
        ("proc-net-snmp-kernel6.18-h200-vm.txt",
         {"RetransSegs": 0, "OutSegs": 31, "InCsumErrors": 0, "MaxConn": -1}, 9),
    ],
)
def test_proc_net_snmp_published_kernels(name: str, tcp: dict[str, int], udp_fields: int
                                         ) -> None:
    """Tcp and Udp rows of three kernels: without InCsumErrors (a CentOS 6 era server), with
    it, and 6.18's IgnoredMulti/MemErrors; MaxConn is -1 in all (published/README.md)."""
    text = published(name)
    counters = network.proc_net_snmp(text)
    assert {key: counters[key] for key in tcp} == tcp
    assert len(network.proc_net_snmp(text, "Udp")) == udp_fields


def test_xid_events_none_in_real_log() -> None:
    assert xid.xid_events(h200("dmesg_xid.txt")) == []


def test_xid_events_synthetic_log() -> None:
    events = xid.xid_events(sample("synthetic_dmesg_xid.txt"))
    assert [event["xid"] for event in events] == [13, 13, 31, 48, 63, 94, 64, 74, 95, 79, 79]
    assert events[0] == {
        "pci": "0000:18:00",
        "xid": 13,
        "message": "Graphics SM Warp Exception on (GPC 4, TPC 2, SM 1): Out Of Range Address",
        "at": 8123.441257,
    }
    assert events[3]["message"].startswith("An uncorrectable double bit error (DBE)")
    assert events[7] == {
        "pci": "0000:9a:00",
        "xid": 74,
        "message": "NVLink: fatal error detected on link 7(0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x10000)",
        "at": 12873.009412,
    }
    assert {k: events[9][k] for k in ("pci", "xid", "message")} == {
        "pci": "0000:db:00", "xid": 79, "message": "GPU has fallen off the bus."}
    assert {k: events[10][k] for k in ("pci", "xid", "message")} == {
        "pci": "0000:3b:00", "xid": 79, "message": "GPU has fallen off the bus."}


def test_xid_events_unreadable_log() -> None:
    with pytest.raises(ParseError, match="'dmesg: read kernel buffer failed"):
        xid.xid_events("dmesg: read kernel buffer failed: Operation not permitted\n")


def test_ethtool_stats_and_pause_discard_counters() -> None:
    stats = network.ethtool_stats(sample("synthetic_ethtool_S_mlx5.txt"))
    assert len(stats) == 34
    assert stats["rx_packets"] == 982364123
    assert stats["rx_prio3_bytes"] == 3870022115520
    assert network.pause_and_discard_counters(stats) == {
        "rx_discards_phy": 12,
        "tx_discards_phy": 0,
        "rx_pause_ctrl_phy": 88214,
        "tx_pause_ctrl_phy": 4310,
        "rx_prio0_discards": 0,
        "rx_prio3_discards": 0,
        "rx_prio3_pause": 88214,
        "rx_prio3_pause_duration": 190233,
        "tx_prio3_pause": 4310,
        "tx_prio3_pause_duration": 9876,
        "rx_prio3_pause_transition": 44107,
        "tx_pause_storm_warning_events": 0,
        "tx_pause_storm_error_events": 0,
    }


def test_ethtool_stats_per_queue_prefix() -> None:
    text = "NIC statistics:\n     [0]: rx_ucast_packets: 5\n     [1]: rx_ucast_packets: 7\n"
    assert network.ethtool_stats(text) == {"[0]: rx_ucast_packets": 5, "[1]: rx_ucast_packets": 7}


def test_ethtool_stats_ena_without_a_header() -> None:
    """Amazon ENA 1.2.0k, as ethq keeps it: no ``NIC statistics:`` line, no indentation,
    per-queue counters only (published/README.md)."""
    stats = network.ethtool_stats(published("ethtool-S-ena-1.2.0k.txt"))
    assert len(stats) == 104
    assert stats["queue_0_rx_bytes"] == 64430725908
    assert stats["queue_3_rx_rx_copybreak_pkt"] == 169576
    assert stats["ena_admin_q_completed_cmd"] == 28


def test_ethtool_stats_solarflare_queue_names_with_dots() -> None:
    stats = network.ethtool_stats((FIXTURES / "nic" / "sfc-ethtool-S.txt").read_text())
    assert len(stats) == 152
    assert stats["port_rx_dp_di_dropped_packets"] == 27
    assert stats["tx-xdp-cpu-23.tx_packets"] == 0
    assert network.pause_and_discard_counters(stats)["port_tx_pause"] == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no stats available\n", "'no stats available'"),
        ("Cannot get stats strings information: Operation not supported\n", "'Cannot get stats"),
        ("NIC statistics:\n", "at least one counter"),
    ],
)
def test_ethtool_stats_errors(text: str, expected: str) -> None:
    with pytest.raises(ParseError, match=expected):
        network.ethtool_stats(text)


def test_sys_pci_gpus_h200() -> None:
    assert system.sys_pci_gpus(h200("sys_pci_nvidia.txt")) == [
        {
            "address": "0000:00:06.0",
            "class": "0x030200",
            "device": "0x2335",
            "link_speed": 32.0,
            "width": 16,
            "numa": None,
        },
        {
            "address": "0000:00:07.0",
            "class": "0x030200",
            "device": "0x2335",
            "link_speed": 32.0,
            "width": 16,
            "numa": None,
        },
    ]


def test_sys_pci_gpus_filters_other_classes() -> None:
    text = (
        "0000:18:00.0 0x030200 0x2335 16.0 GT/s PCIe x16 numa=0\n"
        "0000:05:00.0 0x068000 0x22a3 Unknown x0 numa=0\n"
        "0000:c1:00.0 0x030000 0x2684 Unknown x16 numa=1\n"
        "0000:c1:00.1 0x040300 0x22ba 16.0 GT/s PCIe x16 numa=1\n"
        "0000:c2:00.4 0x030200 0x2335  x numa=\n"
    )
    gpus = system.sys_pci_gpus(text)
    assert [gpu["address"] for gpu in gpus] == ["0000:18:00.0", "0000:c1:00.0", "0000:c2:00.4"]
    assert (gpus[0]["link_speed"], gpus[0]["width"], gpus[0]["numa"]) == (16.0, 16, 0)
    assert (gpus[1]["link_speed"], gpus[1]["width"], gpus[1]["numa"]) == (None, 16, 1)
    assert (gpus[2]["link_speed"], gpus[2]["width"], gpus[2]["numa"]) == (None, None, None)


def test_sys_pci_gpus_errors() -> None:
    with pytest.raises(ParseError, match="got \"ls: cannot access '/sys/bus"):
        system.sys_pci_gpus("ls: cannot access '/sys/bus/pci/devices/*': No such file\n")
