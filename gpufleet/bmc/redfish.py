"""Reading a node's BMC over Redfish, from the controller (never from the node).

The HTTP side is a requests session (TLS verified against the system's CAs or
``bmc_ca_file``, HTTP basic authentication): one GET per document, without retries or
redirects, its body streamed and stopped at ``MAX_DOCUMENT_BYTES``. sushy's connector is
not used for the reads because it retries on its own and reads whole bodies, and a BMC's
reading must be bounded: one wall-clock budget for all of it (``bmc_read_budget_s``),
``MAX_REQUESTS`` requests, and only links on the BMC's own scheme, host and port are
followed (the password goes nowhere else). The documents are read as the DMTF schema
shapes them, because sushy's resource models carry neither a chassis' ``PowerControl``
readings nor log services. What is read: the chassis collection, each chassis' ``Power``
and ``Thermal`` resources (or, where a BMC has only the newer ones, ``PowerSubsystem``
with its power supplies and ``EnvironmentMetrics``, and ``ThermalSubsystem`` with
``ThermalMetrics`` and its fans), and the entries of every log service of the managers
and systems (following ``@odata.nextLink``, up to ``MAX_PAGES`` pages each; a log cut
short is named, and its events are unknown).

The password travels only in the HTTP Authorization header of a TLS connection to the
BMC: it is never on a command line, never in a message (every error is passed through the
inventory's redaction).
"""

from __future__ import annotations

import json
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
import urllib3.exceptions

from gpufleet.bmc.reading import PART_CHASSIS, power_from_subsystem, thermal_from_subsystem
from gpufleet.bmc.target import BmcError, BmcTarget
from gpufleet.inventory.secrets import redact

ROOT = "/redfish/v1"
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 20.0  # one socket read; the whole reading has its budget
DEFAULT_BUDGET_S = 120.0  # bmc_read_budget_s: every request of one BMC together
MAX_REQUESTS = 1000
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
CHUNK_BYTES = 64 * 1024
MAX_PAGES = 20
MAX_MEMBERS = 64
MAX_LINKED = 256  # members a collection lists by link only that are read, one GET each
_DEFAULT_PORTS = {"https": 443, "http": 80}


@dataclass
class BmcDocuments:
    """The Redfish documents read from one BMC, by resource path, and the logs that could
    be read only in part (why)."""

    chassis: list[dict[str, Any]] = field(default_factory=list)
    power: dict[str, dict[str, Any]] = field(default_factory=dict)
    thermal: dict[str, dict[str, Any]] = field(default_factory=dict)
    log_entries: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    logs_cut: list[str] = field(default_factory=list)
    parts: set[str] = field(default_factory=set)  # chassis that are parts (a GPU, a zone)
    duration_s: float = 0.0


def _origin(url: str) -> tuple[str, str, int] | None:
    parts = urlsplit(url)
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return None
    if parts.username or parts.password or not parts.hostname or port is None:
        return None
    return parts.scheme, parts.hostname.lower(), port


class RedfishReader:
    """One BMC's Redfish service, read within one budget."""

    def __init__(self, target: BmcTarget, budget_s: float = DEFAULT_BUDGET_S) -> None:
        self.target = target
        self.budget_s = budget_s
        self.deadline = time.monotonic() + budget_s
        self.requests = 0
        self._origin = _origin(target.url)
        self._session = requests.Session()
        self._session.auth = (target.user, target.password)
        self._session.headers.update({"Accept": "application/json", "OData-Version": "4.0",
                                      "Accept-Encoding": "identity"})

    def _remaining(self, path: str) -> float:
        """Seconds left of the budget; BmcError once it is spent."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise BmcError(f"{self.target.where}: not read within bmc_read_budget_s "
                           f"({self.budget_s:g} s): stopped at {path} after "
                           f"{self.requests} requests")
        return left

    def url(self, path: str) -> str:
        """The absolute URL of a link; BmcError for a link off the BMC's own scheme, host
        and port, which is never requested (it would carry the password)."""
        url = urljoin(f"{self.target.url}/", path)
        if self._origin is None or _origin(url) != self._origin:
            parts = urlsplit(url)
            where = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
            raise BmcError(f"{self.target.where}: a document links off the BMC, to "
                           f"{redact(where[:120])!r}: not followed")
        return url

    def get(self, path: str) -> dict[str, Any]:
        """The JSON document at ``path``; BmcError saying what went wrong."""
        url = self.url(path)
        self.requests += 1
        if self.requests > MAX_REQUESTS:
            raise BmcError(f"{self.target.where}: more than {MAX_REQUESTS} requests to read "
                           f"it (stopped at {path})")
        left = self._remaining(path)
        try:
            with self._session.get(url, stream=True, allow_redirects=False,
                                   verify=self.target.ca_file or True, timeout=(
                    min(CONNECT_TIMEOUT_S, left), min(READ_TIMEOUT_S, left))) as response:
                self._status(response, path)
                body = self._body(response, path)
        except requests.exceptions.Timeout:
            self._remaining(path)
            raise BmcError(f"{self.target.where}: {path}: no answer within "
                           f"{READ_TIMEOUT_S:g}s") from None
        except requests.exceptions.RequestException as exc:
            raise BmcError(f"{self.target.where}: {_connection_problem(exc)}") from None
        try:
            doc = json.loads(body)
        except RecursionError:
            raise BmcError(f"{self.target.where}: {path} is nested too deeply to read"
                           ) from None
        except ValueError as exc:
            raise BmcError(f"{self.target.where}: {path} is not JSON: {_reason(exc)}"
                           ) from None
        if not isinstance(doc, dict):
            raise BmcError(f"{self.target.where}: {path} is not a Redfish resource")
        return doc

    def _status(self, response: requests.Response, path: str) -> None:
        code = response.status_code
        if code in (401, 403):
            raise BmcError(f"{self.target.where}: the BMC refused the credentials of "
                           f"{self.target.user!r} (HTTP 401/403)")
        if code == 404:
            raise BmcError(f"{self.target.where}: {path} not found")
        if code >= 300:
            raise BmcError(f"{self.target.where}: {path}: HTTP {code}"
                           + (" (redirects are not followed)" if code < 400 else ""))

    def _body(self, response: requests.Response, path: str) -> bytes:
        """The response's body, read a chunk at a time within the budget and at most
        MAX_DOCUMENT_BYTES."""
        limit = f"{MAX_DOCUMENT_BYTES // 2**20} MiB"
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > MAX_DOCUMENT_BYTES:
            raise BmcError(f"{self.target.where}: {path} is {int(declared)} bytes, over "
                           f"{limit}: not read")
        connection = getattr(response.raw, "connection", None)
        sock = getattr(connection, "sock", None)
        chunks: list[bytes] = []
        size = 0
        while True:
            left = self._remaining(path)
            if isinstance(sock, socket.socket):
                sock.settimeout(min(READ_TIMEOUT_S, left))
            try:
                chunk = response.raw.read1(CHUNK_BYTES)
            except (urllib3.exceptions.HTTPError, OSError):
                self._remaining(path)
                raise BmcError(f"{self.target.where}: {path}: the answer stopped (no data "
                               f"within {READ_TIMEOUT_S:g}s, or the connection broke)"
                               ) from None
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > MAX_DOCUMENT_BYTES:
                raise BmcError(f"{self.target.where}: {path} is larger than {limit}: "
                               f"not read further")
            chunks.append(chunk)

    def members(self, path: str) -> tuple[list[dict[str, Any]], str | None]:
        """The members of the collection at ``path`` (each read unless it came expanded),
        following ``@odata.nextLink``, and why the list is incomplete (None when it is
        not): more than MAX_PAGES pages, more than MAX_LINKED members listed by link, or a
        member that is not a resource. ``"Members": null`` is an empty collection."""
        found: list[dict[str, Any]] = []
        page: str | None = path
        linked = 0
        for _ in range(MAX_PAGES):
            if page is None:
                return found, None
            doc = self.get(page)
            items = doc.get("Members")
            if items is None:
                items = []
            if not isinstance(items, list):
                raise BmcError(f"{self.target.where}: {page}: Members is not a list")
            for member in items:
                if not isinstance(member, dict):
                    return found, f"{page}: a member is not a resource: {str(member)[:60]!r}"
                if set(member) <= {"@odata.id"} and isinstance(member.get("@odata.id"), str):
                    linked += 1
                    if linked > MAX_LINKED:
                        return found, f"{path}: more than {MAX_LINKED} members listed by link"
                    found.append(self.get(member["@odata.id"]))
                else:
                    found.append(member)
            link = doc.get("@odata.nextLink")
            page = link if isinstance(link, str) else None
        if page is None:
            return found, None
        return found, f"{path}: more than {MAX_PAGES} pages"

    def complete(self, path: str) -> list[dict[str, Any]]:
        """The members of a collection that must be read whole (power supplies, fans,
        chassis, managers, systems); BmcError when it cannot be."""
        found, cut = self.members(path)
        if cut is not None:
            raise BmcError(f"{self.target.where}: {cut}")
        return found

    def close(self) -> None:
        self._session.close()


def _link(doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    path = value.get("@odata.id") if isinstance(value, dict) else None
    return path if isinstance(path, str) else None


_VERIFY = re.compile(r"certificate verify failed: ([^)(\]\[]+)")


def _connection_problem(exc: BaseException) -> str:
    """Why a connection to the BMC failed, in a few words."""
    text = " ".join(str(exc).split())
    verify = _VERIFY.search(text)
    if verify:
        return (f"its TLS certificate is not trusted ({verify[1].strip()}): set bmc_ca_file to "
                f"the CA bundle it chains to")
    for marker, words in (("Connection refused", "connection refused"),
                          ("timed out", f"no answer within {CONNECT_TIMEOUT_S:g}s"),
                          ("No route to host", "no route to host"),
                          ("Name or service not known", "its name does not resolve")):
        if marker in text:
            return f"unreachable: {words}"
    return f"unreachable: {_reason(exc)}"


def _power_subsystem(reader: RedfishReader, chassis: dict[str, Any]) -> dict[str, Any]:
    """The chassis' PowerSubsystem and EnvironmentMetrics, as a ``Power`` resource."""
    subsystem = reader.get(str(_link(chassis, "PowerSubsystem")))
    supplies = _link(subsystem, "PowerSupplies")
    environment = _link(chassis, "EnvironmentMetrics")
    return power_from_subsystem(
        reader.complete(supplies) if supplies else [],
        reader.get(environment) if environment else None)


def _thermal_subsystem(reader: RedfishReader, chassis: dict[str, Any]) -> dict[str, Any]:
    """The chassis' ThermalSubsystem (ThermalMetrics, Fans), as a ``Thermal`` resource."""
    subsystem = reader.get(str(_link(chassis, "ThermalSubsystem")))
    metrics, fans = _link(subsystem, "ThermalMetrics"), _link(subsystem, "Fans")
    return thermal_from_subsystem(reader.get(metrics) if metrics else None,
                                  reader.complete(fans) if fans else [])


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return redact(text[-300:])


def read(target: BmcTarget, budget_s: float = DEFAULT_BUDGET_S) -> BmcDocuments:
    """Every document the power, thermal and event-log checks read from one BMC, within
    ``budget_s`` seconds in all."""
    start = time.monotonic()
    reader = RedfishReader(target, budget_s)
    docs = BmcDocuments()
    try:
        root = reader.get(ROOT)
        chassis_path = _link(root, "Chassis")
        if chassis_path is None:
            raise BmcError(f"{target.where}: the service root lists no Chassis collection")
        for index, chassis in enumerate(reader.complete(chassis_path)):
            if index >= MAX_MEMBERS:
                break
            _read_chassis(reader, chassis, str(chassis.get("@odata.id") or index), docs)
        for collection in ("Managers", "Systems"):
            path = _link(root, collection)
            if path is not None:
                _read_logs(reader, path, docs)
    finally:
        reader.close()
    docs.duration_s = time.monotonic() - start
    return docs


def _read_chassis(reader: RedfishReader, chassis: dict[str, Any], name: str,
                  docs: BmcDocuments) -> None:
    """A chassis' power and thermal resources, the older ones where the BMC has them (an
    older ``Power`` that lists no power supply takes the PowerSubsystem's). A chassis that
    is a part of the node (``ChassisType`` Module, Component, Zone...) is noted: its power
    is the part's, not the node's."""
    docs.chassis.append(chassis)
    if chassis.get("ChassisType") in PART_CHASSIS:
        docs.parts.add(name)
    power, thermal = _link(chassis, "Power"), _link(chassis, "Thermal")
    subsystem = _link(chassis, "PowerSubsystem") is not None
    if power is not None:
        docs.power[name] = reader.get(power)
        if subsystem and not docs.power[name].get("PowerSupplies"):
            docs.power[name]["PowerSupplies"] = _power_subsystem(reader, chassis)[
                "PowerSupplies"]
    elif subsystem:
        docs.power[name] = _power_subsystem(reader, chassis)
    if thermal is not None:
        docs.thermal[name] = reader.get(thermal)
    elif _link(chassis, "ThermalSubsystem") is not None:
        docs.thermal[name] = _thermal_subsystem(reader, chassis)


def _read_logs(reader: RedfishReader, collection: str, docs: BmcDocuments) -> None:
    """The entries of every log service of the collection's members (managers, systems)."""
    for index, owner in enumerate(reader.complete(collection)):
        services = _link(owner, "LogServices")
        if services is None:
            continue
        if index >= MAX_MEMBERS:
            docs.logs_cut.append(f"{collection}: the logs of members past the first "
                                 f"{MAX_MEMBERS} are not read")
            break
        for service in reader.complete(services):
            entries = _link(service, "Entries")
            if entries is not None:
                docs.log_entries[entries], cut = reader.members(entries)
                if cut is not None:
                    docs.logs_cut.append(f"log {entries} read in part: {cut}")
