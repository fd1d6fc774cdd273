"""The standing watch's report as the controller reads it: the parser on reports of the
program's format and on hostile ones (each costs that node's reading only, saying why), the
``watch`` fact's bounded read on this machine, the role registry asking for it only where
the watch is in use, and the reading drift, conformance and facts share."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet import app
from gpufleet.errors import ParseError, VarError
from gpufleet.facts import catalog, script
from gpufleet.facts.gather import Facts, parse_sections
from gpufleet.facts.parsers.watch import REPORT_LIMIT, RISING_LIMIT, TEXT_LIMIT, watch_report
from gpufleet.facts.report import ago, watch_lines
from gpufleet.facts.summary import summarize_facts
from gpufleet.facts.watch import Reading, Rising, from_fact, reading
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.report.schemas import SchemaError, validate
from gpufleet.roles import host_request, watch_request, watch_setup
from tests.conftest import FIXTURES

WATCH = FIXTURES / "watch"
MIXED = (WATCH / "report_open_pending_silenced.json").read_text()
CLEAN = (WATCH / "report_clean.json").read_text()
COMPACT = (WATCH / "report_compact_two_open.json").read_text()
PROGRAM = (WATCH / "report_program_rising.json").read_text()


def report(**changes: Any) -> str:
    doc = json.loads(MIXED)
    doc.update(changes)
    return json.dumps(doc)


def finding(**changes: Any) -> str:
    doc = json.loads(MIXED)
    doc["findings"][0].update(changes)
    return json.dumps(doc)


def fresh(text: str, age: float = 60.0) -> str:
    """The report as if written ``age`` seconds ago by this machine's clock."""
    doc = json.loads(text)
    doc["time"] = time.time() - age
    return json.dumps(doc)


def rise(index: int = 0, **changes: Any) -> str:
    doc = json.loads(MIXED)
    doc["rising"][index].update(changes)
    return json.dumps(doc)


# ---- the parser --------------------------------------------------------------------------


def test_a_report_with_every_status_reads_in_its_order() -> None:
    parsed = watch_report(MIXED)
    assert parsed["time"] == 1765000000.0
    assert parsed["series"] == 212
    assert [(f["id"], f["class"], f["status"]) for f in parsed["findings"]] == [
        ("rdma/mlx5_0/1/symbol_error", "fabric", "open"),
        ("pcie/0000:3b:00.0/width", "pcie", "pending"),
        ("nvlink/GPU3/link7/replay", "nvlink", "silenced")]
    silenced = parsed["findings"][2]
    assert silenced["silenced_until"] == 1765090000.0
    assert silenced["silence_reason"] == "RMA ticket 4471, cable swap on Friday"
    assert parsed["findings"][0]["message"] == (
        "mlx5_0/1 symbol_error +14 in 1h0m (14.0/h, limit 10/h over 1h)")
    assert parsed["notes"] == [
        "nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT: timed out after 4s"]


def test_one_line_reports_read_the_same_as_indented_ones() -> None:
    assert watch_report(json.dumps(json.loads(MIXED))) == watch_report(MIXED)
    assert watch_report(CLEAN) == {"time": 1765003600.25, "findings": [], "notes": [],
                                   "series": 96, "rising": []}
    compact = watch_report(COMPACT)
    assert [f["status"] for f in compact["findings"]] == ["open", "open", "silenced"]
    assert compact["findings"][2]["silence_reason"] is None


def test_keys_a_later_watch_adds_are_ignored() -> None:
    doc = json.loads(MIXED)
    doc["rates"] = [{"counter": "symbol_error"}]
    doc["findings"][0]["action"] = "reseat the cable"
    assert watch_report(json.dumps(doc)) == watch_report(MIXED)


def test_long_texts_are_cut_and_many_notes_counted() -> None:
    parsed = watch_report(report(notes=[f"note {i}" for i in range(50)]))
    assert len(parsed["notes"]) == 20
    assert parsed["notes"][-1] == "(+31 more notes)"
    long = watch_report(finding(message="x" * 5000))["findings"][0]["message"]
    assert len(long) == TEXT_LIMIT and long.endswith("...")


@pytest.mark.parametrize(("text", "message"), [
    ("", "expected one JSON document, got empty output"),
    ("garbage\x00\x1b[31m", "expected one JSON document"),
    ('{"version": 1}{"version": 1}', "expected one JSON document"),
    ("[" * 100_000, "expected a JSON document nested less deeply"),
    ("[]", "expected a JSON object, got a list"),
    (report(version=2), r"expected version 1 \(this gpufleet reads version 1\), got '2'"),
    (report(version=True), "expected version 1"),
    (report(time=float("nan")), "expected time a number of seconds, got 'nan'"),
    (report(time=-5), "expected time a number of seconds"),
    (report(time="now"), "expected time a number of seconds, got 'now'"),
    ('{"version":1,"time":' + "9" * 4000 + ',"findings":[],"notes":[],"series":0}',
     "expected time a number of seconds"),
    (report(findings={"a": 1}), "expected findings a list, got an object"),
    (report(findings=[[]]), r"expected findings\[0\] an object, got a list"),
    (report(notes="one"), "expected notes a list"),
    (report(notes=[3]), r"expected notes\[\] each a string"),
    (report(series=-1), "expected series a count"),
    (report(series=None), "expected series a count, got null"),
    (finding(id="rdma/mlx5_0/1 ; rm -rf /"), r"findings\[0\].id of letters"),
    (finding(id=""), r"findings\[0\].id of letters"),
    (finding(id="x" * 201), r"findings\[0\].id of letters"),
    (finding(**{"class": "Fabric!"}), r"findings\[0\].class a lower-case word"),
    (finding(status="OPEN"), r"findings\[0\].status one of pending, open, silenced"),
    (finding(status=None), r"findings\[0\].status one of"),
    (finding(since=None), r"findings\[0\].since a number of seconds, got null"),
    (finding(message=None), r"findings\[0\].message a string, got null"),
    (finding(silenced_until="tomorrow"), r"findings\[0\].silenced_until a number"),
    (finding(silence_reason=7), r"findings\[0\].silence_reason a string"),
    (finding(id="pcie/0000:3b:00.0/width"), "finding pcie/0000:3b:00.0/width appears twice"),
    (" " * (REPORT_LIMIT + 1), "more than 524288 bytes; not read"),
], ids=lambda v: v[:40] if isinstance(v, str) else None)
def test_a_hostile_or_broken_report_is_a_parse_error(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        watch_report(text)


def test_rising_counters_are_read_with_their_rates_and_limits() -> None:
    assert watch_report(MIXED)["rising"] == [
        {"subject": "mlx5_0/1", "counter": "symbol_error", "increase": 14, "window": 3600.0,
         "rate_per_hour": 14.0, "limit": 10.0},
        {"subject": "0000:3b:00.0", "counter": "aer_correctable", "increase": 3,
         "window": 60.0, "rate_per_hour": 36.0, "limit": 8.0}]
    parsed = watch_report(PROGRAM)
    assert parsed["notes"] == [] and parsed["series"] == 137
    assert [(r["subject"], r["counter"], r["increase"], r["limit"])
            for r in parsed["rising"]] == [
        ("mlx5_0/1", "symbol_error", 200, 120.0), ("mlx5_1/1", "symbol_error", 30, 120.0),
        ("mlx5_0/1", "out_of_sequence", 5, 100.0), ("0000:18:00.0", "aer_correctable", 2, 8.0),
        ("gpu0/link3", "replay_errors", 2, None)]
    without_limit = json.loads(MIXED)
    del without_limit["rising"][0]["limit"]
    assert watch_report(json.dumps(without_limit))["rising"][0]["limit"] is None
    assert watch_report(report(rising=None))["rising"] == []


BAD_RISING = [
    (report(rising={"mlx5_0/1": 14}), "expected rising a list, got an object"),
    (report(rising="symbol_error"), "expected rising a list, got 'symbol_error'"),
    (report(rising=[None]), r"expected rising\[0\] an object, got null"),
    (rise(subject="mlx5_0/1; reboot"), r"rising\[0\].subject of letters"),
    (rise(subject="x" * 201), r"rising\[0\].subject of letters"),
    (rise(subject=""), r"rising\[0\].subject of letters"),
    (rise(1, counter="Symbol Error"), r"rising\[1\].counter a lower-case name"),
    (rise(counter="x" * 65), r"rising\[0\].counter a lower-case name"),
    (rise(counter=None), r"rising\[0\].counter a lower-case name \(at most 64\), got null"),
    (rise(increase=-1), r"rising\[0\].increase a count"),
    (rise(increase=1.5), r"rising\[0\].increase a count"),
    (rise(increase=True), r"rising\[0\].increase a count"),
    (rise(increase=2**64 + 1), r"rising\[0\].increase a count \(at most 2\^64\)"),
    (rise(window=0), r"rising\[0\].window more than 0 seconds"),
    (rise(window="1h"), r"rising\[0\].window a number of seconds, got '1h'"),
    (rise(rate_per_hour=float("inf")), r"rising\[0\].rate_per_hour a number, 0 or more"),
    (rise(rate_per_hour=None), r"rising\[0\].rate_per_hour a number, 0 or more"),
    (rise(limit=-3), r"rising\[0\].limit a number, 0 or more, or null"),
    (rise(1, limit="8"), r"rising\[1\].limit a number, 0 or more, or null, got '8'"),
]


@pytest.mark.parametrize(("text", "why"), BAD_RISING, ids=lambda v: v[-40:])
def test_a_bad_rising_list_costs_the_rising_counters_only_with_a_note(text: str,
                                                                       why: str) -> None:
    parsed = watch_report(text)
    assert parsed["rising"] == []
    assert parsed["findings"] == watch_report(MIXED)["findings"]
    assert parsed["notes"][1:] == watch_report(MIXED)["notes"]
    assert parsed["notes"][0].startswith("rising counters not read: expected ")
    assert re.search(why, parsed["notes"][0]), parsed["notes"][0]


def test_more_rising_counters_than_the_watch_lists_are_cut_with_a_note() -> None:
    entry = json.loads(MIXED)["rising"][0]
    parsed = watch_report(report(rising=[entry] * (RISING_LIMIT + 36),
                                 notes=[f"note {i}" for i in range(30)]))
    assert len(parsed["rising"]) == RISING_LIMIT
    assert parsed["notes"][0] == "rising counters: the first 64 read, 36 more left out"
    assert len(parsed["notes"]) == 20 and parsed["notes"][-1] == "(+12 more notes)"
    long = watch_report(rise(subject="s" * 200, counter="c" * 64))["rising"][0]
    assert (len(long["subject"]), len(long["counter"])) == (200, 64)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                    | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=6), max_leaves=30)
ENTRY = st.fixed_dictionaries({
    "subject": st.one_of(st.sampled_from(["mlx5_0/1", "gpu0/link3", "0000:18:00.0"]), JSON),
    "counter": st.one_of(st.sampled_from(["symbol_error", "replay_errors"]), JSON),
    "increase": st.one_of(st.integers(-5, 2**65), JSON),
    "window": st.one_of(st.floats(allow_nan=True), JSON),
    "rate_per_hour": st.one_of(st.floats(allow_nan=True, allow_infinity=True), JSON),
    "limit": st.one_of(st.none(), st.floats(), JSON)})


@settings(max_examples=150, deadline=None, derandomize=True)
@given(value=st.one_of(JSON, st.lists(st.one_of(ENTRY, JSON), max_size=70)))
def test_any_rising_value_leaves_the_findings_and_reads_whole_or_not_at_all(
        value: Any) -> None:
    doc = json.loads(MIXED)
    doc["rising"] = value
    parsed = watch_report(json.dumps(doc))
    assert parsed["findings"] == watch_report(MIXED)["findings"]
    if value is None:
        assert parsed["rising"] == []
        return
    assert len(parsed["rising"]) <= RISING_LIMIT
    read_all = isinstance(value, list) and len(parsed["rising"]) == min(len(value),
                                                                       RISING_LIMIT)
    assert read_all or (parsed["rising"] == [] and parsed["notes"][0].startswith(
        "rising counters not read: "))
    for entry in parsed["rising"]:
        assert set(entry) == {"subject", "counter", "increase", "window", "rate_per_hour",
                              "limit"}
        assert 0 <= entry["increase"] <= 2**64 and entry["window"] > 0
        assert len(entry["subject"]) <= 200 and len(entry["counter"]) <= 64
        Rising(**entry).describe()


def test_a_bad_report_costs_that_nodes_reading_only() -> None:
    facts = [catalog.Fact("hostname", "hostname", catalog.BASE_FACTS[0].parse),
             catalog.watch_fact("/var/lib/gpufleet")]
    output = "".join(f"\n@@gpufleet:{name}@@\n{body}\n@@gpufleet-rc:0@@\n"
                     for name, body in (("hostname", "bm9kZTAx"),  # node01
                                        ("watch", "eyJ2ZXJzaW9uIjogMn0=")))  # {"version": 2}
    parsed = parse_sections("node01", output, facts)
    assert parsed.values == {"hostname": "node01"}
    assert parsed.absent["watch"].startswith("unparseable output: watch report: expected "
                                             "version 1")


# ---- the fact's bounded read -------------------------------------------------------------


def _read(state_dir: Path) -> Facts:
    fact = catalog.watch_fact(str(state_dir))
    nonce = script.new_nonce()
    composite = script.compose([script.Snippet(fact.name, fact.shell)], nonce)
    done = subprocess.run(["sh", "-c", composite], capture_output=True, text=True, timeout=30,
                          check=False)
    return parse_sections("here", done.stdout, [fact], nonce)


def test_the_fact_reads_the_report_the_watch_keeps(tmp_path: Path) -> None:
    (tmp_path / "watch-report.json").write_text(MIXED)
    assert _read(tmp_path).values["watch"] == watch_report(MIXED)
    assert catalog.watch_fact(str(tmp_path)) is catalog.watch_fact(str(tmp_path))


def test_no_report_yet_is_an_absent_fact_saying_so(tmp_path: Path) -> None:
    assert _read(tmp_path).absent["watch"] == (
        f"no watch report at {tmp_path}/watch-report.json (the watch has not run yet)")


def test_a_fifo_or_a_device_is_not_read_and_never_blocks(tmp_path: Path) -> None:
    fifo, device = tmp_path / "fifo", tmp_path / "device"
    fifo.mkdir()
    device.mkdir()
    os.mkfifo(fifo / "watch-report.json")
    (device / "watch-report.json").symlink_to("/dev/zero")
    for where in (fifo, device):
        assert _read(where).absent["watch"] == (
            f"{where}/watch-report.json is not a regular file: not read")


def test_an_oversized_report_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "watch-report.json").write_text(" " * (REPORT_LIMIT + 10) + CLEAN)
    assert _read(tmp_path).absent["watch"] == (
        f"{tmp_path}/watch-report.json is {REPORT_LIMIT + 10 + len(CLEAN)} bytes, more than "
        f"{REPORT_LIMIT}: not read")


# ---- where the watch is in use -----------------------------------------------------------


def inventory(tmp_path: Path, text: str) -> Inventory:
    path = tmp_path / "hosts.yml"
    path.write_text(text)
    return load_inventory(path)


HOSTS = """all:
  vars:
    ansible_connection: local
  hosts:
    plain:
    watched:
      slurm_healthcheck: true
      slurm_healthcheck_state_dir: /srv/gpufleet/state
    unwatched:
      slurm_healthcheck: true
      node_watch: false
    moved:
      slurm_healthcheck: true
      node_watch: "yes"
      node_watch_path: /opt/site/bin/gpufleet-watch
      node_watch_config: /opt/site/watch.json
    bad:
      slurm_healthcheck: true
      node_watch_path: "/usr/local/sbin/gpufleet-watch; reboot"
"""


def test_the_report_is_asked_for_only_where_the_watch_is_in_use(tmp_path: Path) -> None:
    hosts = inventory(tmp_path, HOSTS).hosts
    assert watch_setup(hosts["plain"]) is None
    assert watch_setup(hosts["unwatched"]) is None
    assert watch_request(hosts["plain"]).custom == frozenset()
    setup = watch_setup(hosts["watched"])
    assert setup is not None
    assert (setup.program, setup.config, setup.state_dir) == (
        "/usr/local/sbin/gpufleet-watch", "/etc/gpufleet/watch.json", "/srv/gpufleet/state")
    assert catalog.watch_fact("/srv/gpufleet/state") in host_request(hosts["watched"]).custom
    moved = watch_setup(hosts["moved"])
    assert moved is not None
    assert (moved.program, moved.config, moved.state_dir) == (
        "/opt/site/bin/gpufleet-watch", "/opt/site/watch.json", "/var/lib/gpufleet")
    assert "watch" not in {f.name for f in host_request(hosts["plain"]).custom}
    with pytest.raises(VarError, match="node_watch_path must be an absolute path"):
        watch_setup(hosts["bad"])


# ---- the reading model -------------------------------------------------------------------


def test_a_reading_names_the_first_open_finding_and_the_silences() -> None:
    facts = Facts("node01", values={"watch": watch_report(COMPACT), "clock": 1765007300.0})
    found = reading(facts)
    assert found is not None and found.report is not None
    report = found.report
    assert report.problem() == ("rdma/mlx5_1/1/flaps: mlx5_1/1 went down 3 times in 12h0m "
                                "(limit 3 within 12h) (+1 more)")
    assert report.counts() == "2 open, 0 pending, 1 silenced, 1480 series"
    assert report.silences() == ["pcie/0000:18:00.0/aer_fatal silenced until "
                                 "2025-12-07T09:33:20Z"]
    assert report.age_s == 100.0
    assert reading(Facts("node01")) is None
    unknown = reading(Facts("node01", absent={"watch": "no watch report at /x"}))
    assert unknown is not None and unknown.report is None
    assert unknown.to_dict() == {"unknown": "no watch report at /x"}
    assert from_fact(watch_report(CLEAN)).problem() is None


def test_a_report_older_than_the_bound_says_the_watch_stopped() -> None:
    facts = Facts("node01", values={"watch": watch_report(CLEAN), "clock": 1765011100.0})
    found = reading(facts, 1800.0)
    assert found is not None and found.report is not None
    assert found.report.age_s == 7499.75
    assert found.stale == ("the watch's last report is 2h5m old (2025-12-06T06:46:40Z), more "
                           "than watch_max_age_s 1800: the watch stopped running")
    assert found.to_dict()["stale"] == found.stale
    assert reading(facts, 7500.0).stale is None  # type: ignore[union-attr]
    assert reading(facts).stale is None  # type: ignore[union-attr]
    unclocked = reading(Facts("node01", values={"watch": watch_report(CLEAN)}), 1.0)
    assert unclocked is not None and unclocked.stale is None, "no clock: its age is unknown"
    assert Reading(None, "no watch report at /x", 1800.0).stale is None




# ---- the facts command -------------------------------------------------------------------


def test_the_summary_counts_findings_by_status() -> None:
    def summary(**facts: Any) -> Any:
        absent = facts.pop("absent", {})
        return summarize_facts(Facts("node01", values=facts, absent=absent))["watch"]

    assert summary() is None
    assert summary(absent={"watch": "no watch report at /x"}) == "unknown"
    assert summary(watch=watch_report(CLEAN)) == "clean"
    assert summary(watch=watch_report(MIXED)) == "1 open, 1 pending, 1 silenced, 2 rising"
    assert summary(watch=watch_report(COMPACT)) == "2 open, 1 silenced"
    quiet = json.loads(PROGRAM)
    quiet["findings"] = []
    assert summary(watch=watch_report(json.dumps(quiet))) == "clean, 5 rising"


def test_the_facts_command_shows_each_finding_with_its_rate_and_the_silence() -> None:
    facts = Facts("node01", values={"watch": watch_report(MIXED), "clock": 1765000300.0})
    assert watch_lines(facts) == [
        "watch: 1 open, 1 pending, 1 silenced, 212 series (report 2025-12-06T05:46:40Z, "
        "5m ago)",
        "  OPEN rdma/mlx5_0/1/symbol_error: mlx5_0/1 symbol_error +14 in 1h0m (14.0/h, "
        "limit 10/h over 1h)",
        "  PENDING pcie/0000:3b:00.0/width: 0000:3b:00.0 (NIC) link x8, capable of x16 "
        "(1 of 2 observations)",
        "  SILENCED nvlink/GPU3/link7/replay: GPU3 link 7 replay +412 in 1h0m (412.0/h, "
        "limit 100/h over 1h) [silenced until 2025-12-07T06:46:40Z (RMA ticket 4471, cable "
        "swap on Friday)]",
        "  RISING mlx5_0/1 symbol_error +14 within 1h: 14/h (limit 10/h)",
        "  RISING 0000:3b:00.0 aer_correctable +3 within 1m: 0.6/min (limit 8/min)",
        "  note: nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT: timed out after 4s"]
    assert watch_lines(Facts("node01", values={"watch": watch_report(PROGRAM),
                                               "clock": 1765003610.0}))[-4:] == [
        "  RISING mlx5_1/1 symbol_error +30 within 1h: 30/h (limit 120/h)",
        "  RISING mlx5_0/1 out_of_sequence +5 within 1s: 0.00417/s (limit 100/s)",
        "  RISING 0000:18:00.0 aer_correctable +2 within 1m: 0.1/min (limit 8/min)",
        "  RISING gpu0/link3 replay_errors +2 within 1h: 2/h (any increase opens)"]
    many = json.loads(PROGRAM)
    many["findings"], many["rising"] = [], many["rising"] * 3
    assert watch_lines(Facts("node01", values={"watch": watch_report(json.dumps(many))})) == [
        "watch: 0 open, 0 pending, 0 silenced, 137 series (report 2025-12-06T06:46:40Z)",
        "  RISING mlx5_0/1 symbol_error +200 within 1h: 200/h (limit 120/h)",
        "  RISING mlx5_1/1 symbol_error +30 within 1h: 30/h (limit 120/h)",
        "  RISING mlx5_0/1 out_of_sequence +5 within 1s: 0.00417/s (limit 100/s)",
        "  RISING 0000:18:00.0 aer_correctable +2 within 1m: 0.1/min (limit 8/min)",
        "  RISING gpu0/link3 replay_errors +2 within 1h: 2/h (any increase opens)",
        "  (+10 more rising counters)"]
    assert watch_lines(Facts("node01", values={"watch": watch_report(CLEAN)})) == []
    assert watch_lines(Facts("node01", absent={"watch": "no watch report at /x"})) == []
    assert [ago(s) for s in (0, 59, 60, 7199, 86400 * 3)] == ["0s", "59s", "1m", "1h", "3d"]


def test_facts_over_a_local_connection_show_the_watch_and_validate(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "watch-report.json").write_text(COMPACT)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    node01:\n      ansible_connection: local\n"
                   "      slurm_healthcheck: true\n"
                   f"      slurm_healthcheck_state_dir: {tmp_path}/state\n")
    out = io.StringIO()
    assert app.facts(str(inv), json_path=str(tmp_path / "facts.json"), out=out) == 0
    text = out.getvalue()
    assert "node01: watch: 2 open, 0 pending, 1 silenced, 1480 series" in text
    assert "node01:   OPEN ecc/GPU5/uncorrectable_aggregate: GPU5 ECC uncorrectable " \
           "aggregate +1 (any increase opens)" in text
    document = json.loads((tmp_path / "facts.json").read_text())
    validate(document)
    host = document["hosts"]["node01"]
    assert host["summary"]["watch"] == "2 open, 1 silenced"
    assert [f["id"] for f in host["facts"]["watch"]["findings"]] == [
        "rdma/mlx5_1/1/flaps", "ecc/GPU5/uncorrectable_aggregate", "pcie/0000:18:00.0/aer_fatal"]
    assert host["facts"]["watch"]["rising"] == []


def test_facts_show_the_rising_counters_the_program_reported(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "watch-report.json").write_text(PROGRAM)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    node01:\n      ansible_connection: local\n"
                   "      slurm_healthcheck: true\n"
                   f"      slurm_healthcheck_state_dir: {tmp_path}/state\n")
    out = io.StringIO()
    assert app.facts(str(inv), json_path=str(tmp_path / "facts.json"), out=out) == 0
    text = out.getvalue()
    assert "node01:   RISING mlx5_0/1 symbol_error +200 within 1h: 200/h (limit 120/h)" in text
    assert "node01:   RISING gpu0/link3 replay_errors +2 within 1h: 2/h (any increase " \
           "opens)" in text
    document = json.loads((tmp_path / "facts.json").read_text())
    validate(document)
    host = document["hosts"]["node01"]
    assert host["summary"]["watch"] == "2 open, 1 pending, 5 rising"
    assert host["facts"]["watch"]["rising"][0] == {
        "subject": "mlx5_0/1", "counter": "symbol_error", "increase": 200, "window": 3600.0,
        "rate_per_hour": 200.0, "limit": 120.0}
    host["facts"]["watch"]["rising"][0]["limit"] = -1
    with pytest.raises(SchemaError, match=r"rising\[0\]\.limit"):
        validate(document)
