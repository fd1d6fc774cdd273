"""Where a node's BMC is, how it is spoken to (Redfish or IPMI) and how to log in to it,
from the inventory."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host
from gpufleet.inventory.secrets import redact

PROTOCOLS = ("redfish", "ipmi")
IPMI_PORT = 623
DEFAULT_CIPHER_SUITE = 17
IPMI_PASSWORD_MAX = 20  # bytes, IPMI 2.0


class BmcError(GpufleetError):
    """The BMC could not be read; the message names the node and the BMC, never a secret."""


@dataclass(frozen=True)
class BmcTarget:
    """Where a node's BMC is and how to log in to it."""

    node: str
    url: str
    user: str
    password: str = field(repr=False)
    ca_file: str | None = None
    protocol: str = "redfish"
    cipher_suite: int = DEFAULT_CIPHER_SUITE

    @property
    def where(self) -> str:
        return f"{self.node}'s BMC ({self.url})"

    @property
    def host_port(self) -> tuple[str, int]:
        """The BMC's host and port (the IPMI port, 623, unless given)."""
        parts = urlsplit(self.url)
        return str(parts.hostname), parts.port or (IPMI_PORT if self.protocol == "ipmi" else 443)


def target_of(host: Host) -> BmcTarget | None:
    """The host's BMC from ``bmc_address`` (a name, an address, ``host:port`` or an
    ``https://`` URL), ``bmc_user``, ``bmc_password`` and ``bmc_ca_file``; None when the
    host declares no BMC."""
    address = host.vars.get("bmc_address")
    if address in (None, ""):
        return None
    where = host.origin("bmc_address")
    place = f" ({where})" if where else ""
    protocol = str(host.vars.get("bmc_protocol") or "redfish")
    if protocol not in PROTOCOLS:
        raise GpufleetError(f"host '{host.name}': bmc_protocol must be redfish or ipmi, got "
                            f"{protocol!r}{place}")
    try:
        url = bmc_url(str(address), host.name) if protocol == "redfish" \
            else ipmi_url(str(address), host.name)
    except GpufleetError as exc:
        raise GpufleetError(f"{exc}{place}") from None
    user, password = host.vars.get("bmc_user"), host.vars.get("bmc_password")
    if not user or password in (None, ""):
        raise GpufleetError(f"host '{host.name}': bmc_address is set{place} but bmc_user or "
                            f"bmc_password is not (both are needed to log in to the BMC)")
    if protocol == "ipmi" and len(str(password).encode()) > IPMI_PASSWORD_MAX:
        raise GpufleetError(f"host '{host.name}': bmc_password is longer than IPMI allows "
                            f"({IPMI_PASSWORD_MAX} bytes)")
    ca = host.vars.get("bmc_ca_file")
    suite = host.vars.get("bmc_ipmi_cipher_suite", DEFAULT_CIPHER_SUITE)
    if isinstance(suite, bool) or not str(suite).isdigit() or not 0 <= int(suite) <= 17:
        raise GpufleetError(f"host '{host.name}': bmc_ipmi_cipher_suite must be an IPMI "
                            f"cipher suite from 0 to 17, got {suite!r}")
    return BmcTarget(host.name, url, str(user), str(password), str(ca) if ca else None,
                     protocol, int(suite))


def bmc_url(address: str, node: str) -> str:
    """``https://ADDRESS`` for a bare address; a URL must be https and carry no path or
    credentials."""
    url = address if "://" in address else f"https://{address}"
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname or parts.username or parts.password \
            or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise GpufleetError(f"host '{node}': bmc_address must be a host name, an address, "
                            f"host:port or https://host[:port], got {redact(address)!r}")
    return f"https://{parts.netloc}"


def ipmi_url(address: str, node: str) -> str:
    """``ipmi://HOST[:PORT]`` for an IPMI BMC's ``host`` or ``host:port``."""
    parts = urlsplit(f"//{address}")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if "://" in address or not parts.hostname or parts.username or parts.path or \
            parts.query or parts.fragment or (port is not None and not 0 < port < 65536):
        raise GpufleetError(f"host '{node}': bmc_address of an IPMI BMC must be a host name, "
                            f"an address or host:port, got {redact(address)!r}")
    return f"ipmi://{parts.netloc}"
