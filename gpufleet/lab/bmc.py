"""BMCs for lab nodes: one Redfish service per node on the controller's loopback, as a
real BMC sits on an out-of-band network the controller reaches and the node does not.

Each service is sushy-tools' static mockup server (``sushy_tools.static``) over a mockup
in the shapes of DMTF's published schema for a GPU server (a chassis with four PSUs, its
input power and power metrics, intake and exhaust temperatures, GPU temperatures, six
fans; a manager with a SEL log service), behind HTTPS with a certificate of the lab's own
CA and HTTP basic authentication (sushy-static has neither). The mockup files are read on
every request, so a fault is injected by rewriting one: a failed PSU, a PSU rated too low,
a hot inlet, a new critical SEL entry.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import hmac
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http import server as http_server
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpufleet.errors import LabError

ADDRESS = "127.0.0.1"
CHASSIS = "Chassis/GPU-Server"
POWER = f"{CHASSIS}/Power"
THERMAL = f"{CHASSIS}/Thermal"
SEL = "Managers/BMC/LogServices/SEL/Entries"
PSU_W = 3000
START_TIMEOUT_S = 20.0


def _doc(path: str, odata_type: str, **body: Any) -> dict[str, Any]:
    return {"@odata.id": f"/redfish/v1/{path}".rstrip("/"), "@odata.type": odata_type, **body}


def _ok(state: str = "Enabled", health: str = "OK") -> dict[str, str]:
    return {"State": state, "Health": health}


def _stamp(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def mockup(node: str, now: dt.datetime) -> dict[str, dict[str, Any]]:
    """The Redfish resources of a healthy GPU server's BMC, by path under /redfish/v1."""
    psus = [{"@odata.id": f"/redfish/v1/{POWER}#/PowerSupplies/{i}", "MemberId": str(i),
             "Name": f"PSU{i + 1}", "Status": _ok(), "PowerSupplyType": "AC",
             "PowerCapacityWatts": PSU_W, "LastPowerOutputWatts": 1300,
             "Model": "lab-3000W", "SerialNumber": f"{node}-psu{i + 1}"} for i in range(4)]
    temperatures = [
        {"MemberId": "0", "Name": "Inlet Temp", "PhysicalContext": "Intake",
         "ReadingCelsius": 24, "UpperThresholdCritical": 45, "Status": _ok()},
        {"MemberId": "1", "Name": "Exhaust Temp", "PhysicalContext": "Exhaust",
         "ReadingCelsius": 41, "UpperThresholdCritical": 75, "Status": _ok()},
        *({"MemberId": str(2 + g), "Name": f"GPU{g} Temp", "PhysicalContext": "GPU",
           "ReadingCelsius": 38, "UpperThresholdCritical": 87, "Status": _ok()}
          for g in range(2))]
    fans = [{"MemberId": str(i), "Name": f"Fan{i + 1}", "PhysicalContext": "Backplane",
             "Reading": 9000, "ReadingUnits": "RPM", "Status": _ok()} for i in range(6)]
    old = now - dt.timedelta(days=30)
    entries = [
        {"@odata.id": f"/redfish/v1/{SEL}/1", "Id": "1", "EntryType": "SEL",
         "Severity": "OK", "Created": _stamp(now - dt.timedelta(hours=2)),
         "SensorType": "Power Supply", "Message": "Power supply PSU1 presence detected"},
        {"@odata.id": f"/redfish/v1/{SEL}/2", "Id": "2", "EntryType": "SEL",
         "Severity": "Critical", "Created": _stamp(old), "SensorType": "Temperature",
         "Message": "Inlet temperature upper critical going high (cleared since)"}]
    return {
        "": _doc("", "#ServiceRoot.v1_15_0.ServiceRoot", Id="RootService",
                 Name="lab BMC", RedfishVersion="1.17.0",
                 Chassis={"@odata.id": "/redfish/v1/Chassis"},
                 Managers={"@odata.id": "/redfish/v1/Managers"},
                 Systems={"@odata.id": "/redfish/v1/Systems"}),
        "Chassis": _doc("Chassis", "#ChassisCollection.ChassisCollection",
                        Name="Chassis Collection", **{"Members@odata.count": 1},
                        Members=[{"@odata.id": f"/redfish/v1/{CHASSIS}"}]),
        CHASSIS: _doc(CHASSIS, "#Chassis.v1_23_0.Chassis", Id="GPU-Server",
                      Name=f"{node} chassis", ChassisType="RackMount", Status=_ok(),
                      Power={"@odata.id": f"/redfish/v1/{POWER}"},
                      Thermal={"@odata.id": f"/redfish/v1/{THERMAL}"}),
        POWER: _doc(POWER, "#Power.v1_7_1.Power", Id="Power", Name="Power",
                    PowerControl=[{"MemberId": "0", "Name": "System Input Power",
                                   "PowerConsumedWatts": 5200, "Status": _ok(),
                                   "PowerMetrics": {"IntervalInMin": 30,
                                                    "MinConsumedWatts": 900,
                                                    "MaxConsumedWatts": 6100,
                                                    "AverageConsumedWatts": 4800}}],
                    PowerSupplies=psus,
                    Redundancy=[{"MemberId": "0", "Name": "PSU Redundancy", "Mode": "N+m",
                                 "MinNumNeeded": 3, "MaxNumSupported": 4, "Status": _ok()}]),
        THERMAL: _doc(THERMAL, "#Thermal.v1_7_1.Thermal", Id="Thermal", Name="Thermal",
                      Temperatures=temperatures, Fans=fans),
        "Managers": _doc("Managers", "#ManagerCollection.ManagerCollection",
                         Name="Manager Collection", **{"Members@odata.count": 1},
                         Members=[{"@odata.id": "/redfish/v1/Managers/BMC"}]),
        "Managers/BMC": _doc("Managers/BMC", "#Manager.v1_19_0.Manager", Id="BMC",
                             Name="lab BMC", ManagerType="BMC", Status=_ok(),
                             LogServices={"@odata.id": "/redfish/v1/Managers/BMC/LogServices"}),
        "Managers/BMC/LogServices": _doc(
            "Managers/BMC/LogServices", "#LogServiceCollection.LogServiceCollection",
            Name="Log Service Collection", **{"Members@odata.count": 1},
            Members=[{"@odata.id": "/redfish/v1/Managers/BMC/LogServices/SEL"}]),
        "Managers/BMC/LogServices/SEL": _doc(
            "Managers/BMC/LogServices/SEL", "#LogService.v1_5_0.LogService", Id="SEL",
            Name="System Event Log", LogEntryType="SEL",
            Entries={"@odata.id": f"/redfish/v1/{SEL}"}),
        SEL: _doc(SEL, "#LogEntryCollection.LogEntryCollection", Name="SEL Entries",
                  **{"Members@odata.count": len(entries)}, Members=entries),
        "Systems": _doc("Systems", "#ComputerSystemCollection.ComputerSystemCollection",
                        Name="Computer System Collection", **{"Members@odata.count": 0},
                        Members=[]),
    }


def _certificate(directory: Path) -> tuple[Path, Path, Path]:
    """The lab's CA and a server certificate for ADDRESS signed by it: (ca, cert, key)."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufleet lab BMC CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ADDRESS)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(ADDRESS))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "bmc.pem", directory / "bmc.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths


@dataclass
class LabBmc:
    """One node's BMC: its mockup directory and port."""

    node: str
    port: int
    root: Path
    process: subprocess.Popen[bytes] | None = None

    def path(self, resource: str) -> Path:
        return self.root / resource / "index.json"

    def load(self, resource: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.path(resource).read_text())
        return doc

    def store(self, resource: str, doc: dict[str, Any]) -> None:
        target = self.path(resource)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".tmp")
        partial.write_text(json.dumps(doc, indent=1))
        partial.replace(target)

    def fail_psu(self, index: int) -> None:
        """PSU ``index`` reports a critical health (it lost its input)."""
        doc = self.load(POWER)
        doc["PowerSupplies"][index]["Status"] = _ok("UnavailableOffline", "Critical")
        doc["PowerSupplies"][index]["LastPowerOutputWatts"] = 0
        self.store(POWER, doc)

    def rate_psus(self, watts: int) -> None:
        doc = self.load(POWER)
        for psu in doc["PowerSupplies"]:
            psu["PowerCapacityWatts"] = watts
        self.store(POWER, doc)

    def set_power(self, now_w: int, peak_w: int) -> None:
        doc = self.load(POWER)
        doc["PowerControl"][0]["PowerConsumedWatts"] = now_w
        doc["PowerControl"][0]["PowerMetrics"]["MaxConsumedWatts"] = peak_w
        self.store(POWER, doc)

    def set_inlet(self, celsius: float) -> None:
        doc = self.load(THERMAL)
        doc["Temperatures"][0]["ReadingCelsius"] = celsius
        self.store(THERMAL, doc)

    def add_event(self, severity: str, message: str) -> None:
        """A SEL entry created now."""
        doc = self.load(SEL)
        entry_id = str(len(doc["Members"]) + 1)
        doc["Members"].append({"@odata.id": f"/redfish/v1/{SEL}/{entry_id}", "Id": entry_id,
                               "EntryType": "SEL", "Severity": severity,
                               "Created": _stamp(dt.datetime.now(dt.timezone.utc)),
                               "SensorType": "Power Supply", "Message": message})
        doc["Members@odata.count"] = len(doc["Members"])
        self.store(SEL, doc)


@dataclass
class LabBmcs:
    """The lab's BMCs, their CA and the one account they accept."""

    directory: Path
    user: str
    password: str = field(repr=False)
    bmcs: dict[str, LabBmc] = field(default_factory=dict)
    ca: Path | None = None

    def inventory_vars(self, node: str, password: str | None = None) -> dict[str, Any]:
        """What the inventory declares for ``node``'s BMC."""
        return {"bmc_address": f"{ADDRESS}:{self.bmcs[node].port}", "bmc_user": self.user,
                "bmc_password": self.password if password is None else password,
                "bmc_ca_file": str(self.ca)}


@contextlib.contextmanager
def running(directory: Path, nodes: dict[str, int], user: str, password: str
            ) -> Iterator[LabBmcs]:
    """A BMC for each node (node -> port) while the context lasts."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, cert, key = _certificate(directory)
    secret = directory / "account"
    secret.touch(mode=0o600)
    secret.write_text(f"{user}:{password}")
    lab = LabBmcs(directory, user, password, ca=ca)
    now = dt.datetime.now(dt.timezone.utc)
    try:
        for node, port in nodes.items():
            bmc = LabBmc(node, port, directory / node)
            for resource, doc in mockup(node, now).items():
                bmc.store(resource, doc)
            bmc.process = subprocess.Popen(
                [sys.executable, "-m", "gpufleet.lab.bmc", "--mockup", str(bmc.root),
                 "--port", str(port), "--cert", str(cert), "--key", str(key),
                 "--account", str(secret)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            lab.bmcs[node] = bmc
        for bmc in lab.bmcs.values():
            _wait(bmc)
        yield lab
    finally:
        for bmc in lab.bmcs.values():
            if bmc.process is not None:
                bmc.process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    bmc.process.wait(timeout=10)


def _wait(bmc: LabBmc) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert bmc.process is not None
        if bmc.process.poll() is not None:
            error = bmc.process.stderr.read().decode() if bmc.process.stderr else ""
            raise LabError(f"the lab BMC of {bmc.node} exited: {error.strip()[-300:]}")
        with contextlib.suppress(OSError), socket.create_connection((ADDRESS, bmc.port), 1):
            return
        time.sleep(0.1)
    raise LabError(f"the lab BMC of {bmc.node} did not listen on {ADDRESS}:{bmc.port}")


def serve(mockup_dir: Path, port: int, cert: Path, key: Path, account: Path) -> None:
    """sushy-static's handler over ``mockup_dir`` on HTTPS, behind basic authentication."""
    # sushy-tools is a development dependency: only the lab's BMC processes import it.
    from sushy_tools.static import main as static  # noqa: PLC0415

    static.REDFISH_MOCKUP_FILES = str(mockup_dir.resolve())
    expected = base64.b64encode(account.read_bytes().strip()).decode()

    class Handler(static.RequestHandler):  # type: ignore[misc]
        def _log_request(self, method: str) -> None:
            """Quiet: sushy-static prints every request's headers, its Authorization too."""

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

        def do_GET(self) -> None:
            given = self.headers.get("Authorization", "").removeprefix("Basic ").strip()
            if not hmac.compare_digest(given.encode(), expected.encode()):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="lab BMC"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            super().do_GET()

    httpd = http_server.ThreadingHTTPServer((ADDRESS, port), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    httpd.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m gpufleet.lab.bmc")
    parser.add_argument("--mockup", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True)
    parser.add_argument("--account", type=Path, required=True)
    args = parser.parse_args()
    os.umask(0o077)
    serve(args.mockup, args.port, args.cert, args.key, args.account)


if __name__ == "__main__":
    main()
