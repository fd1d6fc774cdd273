"""Host key verification: known_hosts lookup, fingerprints, and explicit trust on first use."""

from __future__ import annotations

import base64
import hashlib
import threading
from pathlib import Path

import paramiko

from gpufleet.errors import GpufleetError


class HostKeyError(GpufleetError):
    """The host's key is unknown or differs from the recorded one; the host is refused."""


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    """The name a host is recorded under in known_hosts."""
    return address if port == 22 else f"[{address}]:{port}"


_record_lock = threading.Lock()
_cache_lock = threading.Lock()
_cache: dict[Path, tuple[int, int, paramiko.HostKeys]] = {}


def known_keys(path: Path) -> paramiko.HostKeys:
    """A known_hosts file, parsed once per content (keyed by mtime and size): a fleet run
    connects to every host, and parsing a large file per connection costs O(hosts^2). The
    first of many threads asking at once parses it; the others wait for its result."""
    stat = path.stat()
    with _cache_lock:
        cached = _cache.get(path)
        if cached and cached[:2] == (stat.st_mtime_ns, stat.st_size):
            return cached[2]
        keys = paramiko.HostKeys(str(path))
        _cache[path] = (stat.st_mtime_ns, stat.st_size, keys)
        return keys


def trust_known(client: paramiko.SSHClient, name: str, files: list[Path]) -> None:
    """Give ``client`` the recorded keys of ``name`` (as known_hosts names it) only."""
    for path in files:
        if not path.is_file():
            continue
        entry = known_keys(path).lookup(name)
        for key_type, key in (entry or {}).items():
            client.get_host_keys().add(name, key_type, key)


def record_key(path: Path, address: str, port: int, key: paramiko.PKey) -> None:
    """Append a host key to ``path`` atomically (temp file + rename), creating it if needed."""
    line = f"{known_hosts_name(address, port)} {key.get_name()} {key.get_base64()}\n"
    with _record_lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        old = path.read_text() if path.exists() else ""
        if old and not old.endswith("\n"):
            old += "\n"
        tmp = path.with_name(f".{path.name}.gpufleet-tmp")
        tmp.write_text(old + line)
        tmp.chmod(0o644)
        tmp.replace(path)


class VerifyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys unless trust on first use was explicitly asked for.

    Keys that are recorded but differ never reach a policy: paramiko raises
    BadHostKeyException for them, and gpufleet refuses the host.
    """

    def __init__(self, files: list[Path], accept_new: bool = False,
                 record_to: Path | None = None, expect_fingerprint: str | None = None) -> None:
        self.files = files
        self.accept_new = accept_new
        self.record_to = record_to
        self.expect_fingerprint = expect_fingerprint
        self.accepted: str | None = None

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        fp = fingerprint(key)
        if self.expect_fingerprint and fp != self.expect_fingerprint:
            raise HostKeyError(
                f"host key of {hostname} is {key.get_name()} {fp}, not the expected "
                f"{self.expect_fingerprint}; refusing to connect")
        if not self.accept_new:
            where = ", ".join(str(f) for f in self.files) or "no known_hosts file"
            raise HostKeyError(
                f"host key of {hostname} ({key.get_name()} {fp}) is not in known_hosts "
                f"({where}); verify the fingerprint, then trust it with --accept-new-host-keys "
                "or `invoke bootstrap`")
        if self.record_to is not None:
            address, port = _split_name(hostname)
            record_key(self.record_to, address, port, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.accepted = fp


def _split_name(hostname: str) -> tuple[str, int]:
    if hostname.startswith("[") and "]:" in hostname:
        address, port = hostname[1:].split("]:", 1)
        return address, int(port)
    return hostname, 22


def changed_key_message(exc: paramiko.BadHostKeyException, files: list[Path]) -> str:
    """A clear message for a host whose key changed."""
    where = ", ".join(str(f) for f in files)
    return (f"HOST KEY CHANGED for {exc.hostname}: known_hosts ({where}) has "
            f"{fingerprint(exc.expected_key)}, the host presented {fingerprint(exc.key)}; "
            "refusing to connect (if the node was reinstalled, remove its old line)")
