"""The Redfish reader against the lab's BMC server on loopback (sushy-tools' static handler
behind HTTPS and basic authentication): paging by @odata.nextLink, collections listed by
link, a refused account and a certificate that is not trusted, with no secret in any
message."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from conformance import test_bmc as bmc_suite
from gpufleet.bmc import redfish
from gpufleet.bmc.reading import reading
from gpufleet.bmc.target import BmcError, BmcTarget
from gpufleet.conformance.session import Node
from gpufleet.connect.connection import ConnectOptions
from gpufleet.inventory.model import Host
from gpufleet.lab.bmc import CHASSIS, SEL, LabBmcs, running

PASSWORD = "unit-Redfish-pa55"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def bmc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabBmcs]:
    with running(tmp_path_factory.mktemp("bmc"), {"n1": _free_port()}, "ro", PASSWORD) as lab:
        yield lab


def _target(lab: LabBmcs, password: str = PASSWORD, ca: str | None = "lab") -> BmcTarget:
    found = lab.inventory_vars("n1")
    return BmcTarget("n1", f"https://{found['bmc_address']}", "ro", password,
                     found["bmc_ca_file"] if ca == "lab" else ca)


def test_entries_on_a_second_page_are_read(bmc: LabBmcs) -> None:
    lab = bmc.bmcs["n1"]
    first = lab.load(SEL)
    page2 = f"{SEL}/Page2"
    lab.store(page2, {"@odata.id": f"/redfish/v1/{page2}", "Members": [
        {"@odata.id": f"/redfish/v1/{SEL}/9"}]})
    lab.store(f"{SEL}/9", {"@odata.id": f"/redfish/v1/{SEL}/9", "Id": "9",
                           "Severity": "Critical", "Created": "2026-12-02T07:00:00Z",
                           "Message": "PSU4 input lost"})
    lab.store(SEL, {**first, "@odata.nextLink": f"/redfish/v1/{page2}"})
    try:
        docs = redfish.read(_target(bmc))
    finally:
        lab.store(SEL, first)
    found = reading(docs.power, docs.thermal, docs.log_entries)
    assert [(e.id, e.severity, e.message) for e in found.events] == [
        ("1", "OK", "Power supply PSU1 presence detected"),
        ("2", "Critical", "Inlet temperature upper critical going high (cleared since)"),
        ("9", "Critical", "PSU4 input lost")]
    assert len(found.psus) == 4 and found.power_peak_w == 6100


def test_a_refused_account_and_an_untrusted_certificate_are_named(bmc: LabBmcs,
                                                                  tmp_path: Path) -> None:
    with pytest.raises(BmcError) as refused:
        redfish.read(_target(bmc, password="not-" + PASSWORD))
    assert str(refused.value).endswith("the BMC refused the credentials of 'ro' (HTTP 401/403)")
    with pytest.raises(BmcError) as untrusted:
        redfish.read(_target(bmc, ca=None))
    assert "its TLS certificate is not trusted (unable to get local issuer certificate): " \
           "set bmc_ca_file" in str(untrusted.value)
    assert PASSWORD not in str(refused.value) + str(untrusted.value)


def test_a_bmc_with_only_the_newer_subsystems_is_read_through_them(bmc: LabBmcs) -> None:
    lab = bmc.bmcs["n1"]
    chassis = lab.load(CHASSIS)
    base = f"/redfish/v1/{CHASSIS}"
    newer = {k: v for k, v in chassis.items() if k not in ("Power", "Thermal")}
    newer.update(PowerSubsystem={"@odata.id": f"{base}/PowerSubsystem"},
                 ThermalSubsystem={"@odata.id": f"{base}/ThermalSubsystem"},
                 EnvironmentMetrics={"@odata.id": f"{base}/EnvironmentMetrics"})
    lab.store(f"{CHASSIS}/PowerSubsystem", {"PowerSupplies": {
        "@odata.id": f"{base}/PowerSubsystem/PowerSupplies"}})
    lab.store(f"{CHASSIS}/PowerSubsystem/PowerSupplies", {"Members": [
        {"@odata.id": f"{base}/PowerSubsystem/PowerSupplies/{i}"} for i in (1, 2)]})
    for i, health in ((1, "OK"), (2, "Critical")):
        lab.store(f"{CHASSIS}/PowerSubsystem/PowerSupplies/{i}", {
            "Name": f"PSU{i}", "PowerCapacityWatts": 3000,
            "Status": {"State": "Enabled", "Health": health}})
    lab.store(f"{CHASSIS}/EnvironmentMetrics", {"PowerWatts": {"Reading": 2500}})
    lab.store(f"{CHASSIS}/ThermalSubsystem", {
        "ThermalMetrics": {"@odata.id": f"{base}/ThermalSubsystem/ThermalMetrics"},
        "Fans": {"@odata.id": f"{base}/ThermalSubsystem/Fans"}})
    lab.store(f"{CHASSIS}/ThermalSubsystem/ThermalMetrics", {
        "TemperatureSummaryCelsius": {"Intake": {"Reading": 27}}})
    lab.store(f"{CHASSIS}/ThermalSubsystem/Fans", {"Members": []})
    lab.store(CHASSIS, newer)
    try:
        docs = redfish.read(_target(bmc))
    finally:
        lab.store(CHASSIS, chassis)
    found = reading(docs.power, docs.thermal, docs.log_entries)
    assert [(p.name, p.health) for p in found.psus] == [("PSU1", "OK"), ("PSU2", "Critical")]
    assert found.power_now_w == 2500
    assert [(t.name, t.celsius, t.inlet) for t in found.temperatures] == [
        ("Intake (summary)", 27, True)]


Handler = Callable[[BaseHTTPRequestHandler], None]


@contextlib.contextmanager
def _plain_bmc(routes: dict[str, Any]) -> Iterator[tuple[str, list[str]]]:
    """A plain-HTTP Redfish service on loopback: each path's document (a dict, bytes, or a
    function that answers the request itself); yields its URL and the paths requested."""
    seen: list[str] = []

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path + (" with credentials" if self.headers.get("Authorization")
                                     else ""))
            route = routes.get(self.path)
            if callable(route):
                route(self)
                return
            body = route if isinstance(route, bytes) else json.dumps(route).encode()
            self.send_response(200 if route is not None else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _plain(url: str) -> BmcTarget:
    return BmcTarget("n1", url, "ro", PASSWORD)


def _root(chassis: str = "/redfish/v1/Chassis") -> dict[str, Any]:
    return {"Chassis": {"@odata.id": chassis}, "Managers": {"@odata.id": "/redfish/v1/Managers"}}


def test_members_null_is_an_empty_collection_and_deep_nesting_is_a_reading_error() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    with _plain_bmc({"/redfish/v1": _root(), "/redfish/v1/Chassis": {"Members": None},
                     "/redfish/v1/Managers": {"Members": [{"@odata.id": "/deep"}]},
                     "/deep": deep}) as (url, _), \
            pytest.raises(BmcError, match=r"/deep is nested too deeply to read$"):
        redfish.read(_plain(url))
    with _plain_bmc({"/redfish/v1": {"Chassis": {"@odata.id": "/redfish/v1/Chassis"}},
                     "/redfish/v1/Chassis": {"Members": None}}) as (url, _):
        docs = redfish.read(_plain(url))
    assert docs.chassis == [] and docs.log_entries == {}
    assert reading(docs.power, docs.thermal, docs.log_entries).events_unknown == (
        "the BMC lists no event log (no LogServices with Entries)")


def test_one_bmc_s_failure_costs_its_node_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever one BMC's reading raises, the bmc suite's reader returns it as that node's
    unknown instead of failing the session fixture of every node."""
    def hostile(target: BmcTarget, budget_s: float) -> redfish.BmcDocuments:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(redfish, "read", hostile)
    host = Host("n1", {"bmc_address": "10.0.5.17", "bmc_user": "ro",
                       "bmc_password": PASSWORD}, frozenset())
    node = Node(host, ConnectOptions())
    found = bmc_suite._read_one(node)
    assert found == ("n1's BMC (https://10.0.5.17): could not be read (RecursionError: "
                     "maximum recursion depth exceeded)")
    assert bmc_suite._read_one(Node(Host("n2", {}, frozenset()), ConnectOptions())) is None


def _drip(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Length", "1000")
    handler.end_headers()
    with contextlib.suppress(OSError):
        for _ in range(1000):
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(0.5)


def test_a_bmc_that_drips_its_answer_is_stopped_at_its_budget() -> None:
    with _plain_bmc({"/redfish/v1": _drip}) as (url, _):
        start = time.monotonic()
        with pytest.raises(BmcError, match=r"not read within bmc_read_budget_s \(2 s\): "
                                           r"stopped at /redfish/v1 after 1 requests"):
            redfish.read(_plain(url), budget_s=2)
        assert time.monotonic() - start < 3


def test_requests_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redfish, "MAX_REQUESTS", 5)
    routes: dict[str, Any] = {"/redfish/v1": _root(), "/redfish/v1/Chassis": {
        "Members": [{"@odata.id": f"/c/{i}"} for i in range(10)]}}
    routes.update({f"/c/{i}": {"Id": str(i)} for i in range(10)})
    with _plain_bmc(routes) as (url, seen), \
            pytest.raises(BmcError, match="more than 5 requests to read it"):
        redfish.read(_plain(url))
    assert len(seen) == 5


def test_a_link_to_another_host_or_port_is_never_requested() -> None:
    with _plain_bmc({"/redfish/v1/Chassis": {"Members": []}}) as (other, elsewhere):
        for link, where in ((f"{other}/redfish/v1/Chassis", other),
                            ("https://127.0.0.1/redfish/v1/Chassis", "https://127.0.0.1"),
                            ("//u:pw@attacker.example:99999/x", "http://attacker.example:99999")):
            with _plain_bmc({"/redfish/v1": _root(link)}) as (url, _), \
                    pytest.raises(BmcError) as refused:
                redfish.read(_plain(url))
            assert str(refused.value) == (f"n1's BMC ({url}): a document links off the BMC, "
                                          f"to {where!r}: not followed")
    assert elsewhere == []


def _log_routes(pages: int) -> dict[str, Any]:
    routes: dict[str, Any] = {
        "/redfish/v1": {"Chassis": {"@odata.id": "/redfish/v1/Chassis"},
                        "Managers": {"@odata.id": "/m"}},
        "/redfish/v1/Chassis": {"Members": []},
        "/m": {"Members": [{"LogServices": {"@odata.id": "/m/ls"}}]},
        "/m/ls": {"Members": [{"Entries": {"@odata.id": "/m/ls/e"}}]}}
    for page in range(pages):
        path = "/m/ls/e" if page == 0 else f"/m/ls/e/p{page}"
        routes[path] = {"Members": [{"Id": str(page), "Severity": "Critical",
                                     "Created": "2026-12-02T07:00:00Z", "Message": "IERR"}],
                        **({"@odata.nextLink": f"/m/ls/e/p{page + 1}"}
                           if page + 1 < pages else {})}
    return routes


def test_a_log_past_the_page_limit_is_unknown_not_clean(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setattr(redfish, "MAX_PAGES", 3)
    with _plain_bmc(_log_routes(3)) as (url, _):
        whole = redfish.read(_plain(url))
    assert whole.logs_cut == [] and len(whole.log_entries["/m/ls/e"]) == 3
    with _plain_bmc(_log_routes(4)) as (url, _):
        cut = redfish.read(_plain(url))
    assert cut.logs_cut == ["log /m/ls/e read in part: /m/ls/e: more than 3 pages"]
    found = reading(cut.power, cut.thermal, cut.log_entries, cut.logs_cut)
    assert found.events_unknown == "log /m/ls/e read in part: /m/ls/e: more than 3 pages"


def _endless(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    chunk = b"[" + b" " * 65536
    with contextlib.suppress(OSError):
        for _ in range(10_000):
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))


def test_a_document_is_read_up_to_its_size_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redfish, "MAX_DOCUMENT_BYTES", 1024 * 1024)
    with _plain_bmc({"/redfish/v1": _endless}) as (url, _), \
            pytest.raises(BmcError, match=r"/redfish/v1 is larger than 1 MiB: not read further"):
        redfish.read(_plain(url))
    big = {"/redfish/v1": b" " * (1024 * 1024 + 1)}
    with _plain_bmc(big) as (url, _), \
            pytest.raises(BmcError, match=r"/redfish/v1 is 1048577 bytes, over 1 MiB: not read"):
        redfish.read(_plain(url))
