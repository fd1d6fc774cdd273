"""Where a node's BMC is and how to log in to it, from the inventory."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host
from gpufleet.inventory.secrets import redact


@dataclass(frozen=True)
class BmcTarget:
    """Where a node's BMC is and how to log in to it."""

    node: str
    url: str
    user: str
    password: str = field(repr=False)
    ca_file: str | None = None

    @property
    def where(self) -> str:
        return f"{self.node}'s BMC ({self.url})"


def target_of(host: Host) -> BmcTarget | None:
    """The host's BMC from ``bmc_address`` (a name, an address, ``host:port`` or an
    ``https://`` URL), ``bmc_user``, ``bmc_password`` and ``bmc_ca_file``; None when the
    host declares no BMC."""
    address = host.vars.get("bmc_address")
    if address in (None, ""):
        return None
    where = host.origin("bmc_address")
    place = f" ({where})" if where else ""
    try:
        url = bmc_url(str(address), host.name)
    except GpufleetError as exc:
        raise GpufleetError(f"{exc}{place}") from None
    user, password = host.vars.get("bmc_user"), host.vars.get("bmc_password")
    if not user or password in (None, ""):
        raise GpufleetError(f"host '{host.name}': bmc_address is set{place} but bmc_user or "
                            f"bmc_password is not (both are needed to log in to the BMC)")
    ca = host.vars.get("bmc_ca_file")
    return BmcTarget(host.name, url, str(user), str(password), str(ca) if ca else None)


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
