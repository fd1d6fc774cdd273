"""Reading a node's BMC over Redfish, from the controller (never from the node).

The HTTP side is sushy's connector (TLS verified against the system's CAs or
``bmc_ca_file``, HTTP basic authentication, its error types); the documents are read as
the DMTF schema shapes them, because sushy's resource models carry neither a chassis'
``PowerControl`` readings nor log services. What is read: the chassis collection, each
chassis' ``Power`` and ``Thermal`` resources (or, where a BMC has only the newer ones,
``PowerSubsystem`` with its power supplies and ``EnvironmentMetrics``, and
``ThermalSubsystem`` with ``ThermalMetrics`` and its fans), and the entries of every log
service of the managers and systems (following ``@odata.nextLink``, up to ``MAX_PAGES``
pages each).

The password travels only in the HTTP Authorization header of a TLS connection: it is
never on a command line, never in a message (sushy's own log is kept at WARNING, and every
error is passed through the inventory's redaction).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import sushy.exceptions
from sushy import connector

from gpufleet.bmc.target import BmcError, BmcTarget
from gpufleet.conformance.checks import power as power_checks
from gpufleet.inventory.secrets import redact

ROOT = "/redfish/v1"
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 20.0
MAX_PAGES = 20
MAX_MEMBERS = 64
MAX_LINKED = 256  # members a collection lists by link only that are read, one GET each
logging.getLogger("sushy").setLevel(logging.WARNING)


@dataclass
class BmcDocuments:
    """The Redfish documents read from one BMC, by resource path."""

    chassis: list[dict[str, Any]] = field(default_factory=list)
    power: dict[str, dict[str, Any]] = field(default_factory=dict)
    thermal: dict[str, dict[str, Any]] = field(default_factory=dict)
    log_entries: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    duration_s: float = 0.0


class RedfishReader:
    """One BMC's Redfish service, read with sushy's connector."""

    def __init__(self, target: BmcTarget) -> None:
        self.target = target
        self._conn = connector.Connector(
            target.url, verify=target.ca_file or True, connect_timeout=CONNECT_TIMEOUT_S,
            default_request_timeout=READ_TIMEOUT_S)
        self._conn.set_http_basic_auth(target.user, target.password)

    def get(self, path: str) -> dict[str, Any]:
        """The JSON document at ``path``; BmcError saying what went wrong."""
        try:
            doc = self._conn.get(path, timeout=READ_TIMEOUT_S).json()
        except sushy.exceptions.AccessError:
            raise BmcError(f"{self.target.where}: the BMC refused the credentials of "
                           f"{self.target.user!r} (HTTP 401/403)") from None
        except sushy.exceptions.ResourceNotFoundError:
            raise BmcError(f"{self.target.where}: {path} not found") from None
        except sushy.exceptions.ConnectionError as exc:
            raise BmcError(f"{self.target.where}: {_connection_problem(exc)}") from None
        except (sushy.exceptions.SushyError, ValueError) as exc:
            raise BmcError(f"{self.target.where}: {path}: {_reason(exc)}") from None
        if not isinstance(doc, dict):
            raise BmcError(f"{self.target.where}: {path} is not a Redfish resource")
        return doc

    def members(self, path: str) -> Iterator[dict[str, Any]]:
        """The members of the collection at ``path`` (each read unless it came expanded),
        following ``@odata.nextLink`` up to MAX_PAGES pages; of members listed by link
        only, the first MAX_LINKED are read."""
        page: str | None = path
        linked = 0
        for _ in range(MAX_PAGES):
            if page is None:
                return
            doc = self.get(page)
            for member in doc.get("Members", []):
                if not isinstance(member, dict):
                    continue
                if set(member) <= {"@odata.id"} and isinstance(member.get("@odata.id"), str):
                    linked += 1
                    if linked <= MAX_LINKED:
                        yield self.get(member["@odata.id"])
                else:
                    yield member
            link = doc.get("@odata.nextLink")
            page = link if isinstance(link, str) else None

    def close(self) -> None:
        self._conn.close()


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
    return power_checks.power_from_subsystem(
        list(reader.members(supplies)) if supplies else [],
        reader.get(environment) if environment else None)


def _thermal_subsystem(reader: RedfishReader, chassis: dict[str, Any]) -> dict[str, Any]:
    """The chassis' ThermalSubsystem (ThermalMetrics, Fans), as a ``Thermal`` resource."""
    subsystem = reader.get(str(_link(chassis, "ThermalSubsystem")))
    metrics, fans = _link(subsystem, "ThermalMetrics"), _link(subsystem, "Fans")
    return power_checks.thermal_from_subsystem(reader.get(metrics) if metrics else None,
                                               list(reader.members(fans)) if fans else [])


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return redact(text[-300:])


def read(target: BmcTarget) -> BmcDocuments:
    """Every document the power, thermal and event-log checks read from one BMC."""
    start = time.monotonic()
    reader = RedfishReader(target)
    docs = BmcDocuments()
    try:
        root = reader.get(ROOT)
        chassis_path = _link(root, "Chassis")
        if chassis_path is None:
            raise BmcError(f"{target.where}: the service root lists no Chassis collection")
        for index, chassis in enumerate(reader.members(chassis_path)):
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
    """A chassis' power and thermal resources, the older ones where the BMC has them."""
    docs.chassis.append(chassis)
    power, thermal = _link(chassis, "Power"), _link(chassis, "Thermal")
    if power is not None:
        docs.power[name] = reader.get(power)
    elif _link(chassis, "PowerSubsystem") is not None:
        docs.power[name] = _power_subsystem(reader, chassis)
    if thermal is not None:
        docs.thermal[name] = reader.get(thermal)
    elif _link(chassis, "ThermalSubsystem") is not None:
        docs.thermal[name] = _thermal_subsystem(reader, chassis)


def _read_logs(reader: RedfishReader, collection: str, docs: BmcDocuments) -> None:
    """The entries of every log service of the collection's members (managers, systems)."""
    for index, owner in enumerate(reader.members(collection)):
        services = _link(owner, "LogServices")
        if index >= MAX_MEMBERS or services is None:
            continue
        for service in reader.members(services):
            entries = _link(service, "Entries")
            if entries is not None:
                docs.log_entries[entries] = list(reader.members(entries))
