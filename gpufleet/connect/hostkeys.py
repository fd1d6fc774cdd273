"""Host key verification: known_hosts lookup, fingerprints, and explicit trust on first use.

known_hosts files are read the way OpenSSH reads them (sshd(8), match.c): plain and
hashed (``|1|``) names, comma-separated patterns whose only wildcards are ``*`` and ``?``
(``[`` is an ordinary character: ``[10.0.0.5]:2222`` is the name of port 2222, not a
character class) with ``!`` negation that vetoes the line, ``[host]:port`` names for ports
other than 22 (a bare ``host`` line vouches for another port only with the very key it
records, as ssh's "checking without port identifier" does), and the ``@revoked`` and
``@cert-authority`` markers. Lines that cannot be read are skipped, as ssh skips them. For a
host:

- the first file in the search order that records plain keys for it decides (the
  inventory's pinned ``gpufleet_known_hosts`` wins over ``~/.ssh/known_hosts``);
- a key listed ``@revoked`` in any file is refused, even when it is also recorded;
- a host vouched for only by a ``@cert-authority`` line is refused as unsupported
  (gpufleet does not verify host certificates); other hosts are not affected.

Recording a new key writes through symlinks (the link stays, its target is replaced
atomically) and never replaces anything that is not a regular file: ``/dev/null`` (a
common ``UserKnownHostsFile``) is refused as a place to record keys.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
import re
import stat
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from gpufleet.errors import GpufleetError

__all__ = [
    "HostKeyError", "HostKeys", "KnownEntry", "VerifyPolicy", "changed_key_message",
    "fingerprint", "known_entries", "known_hosts_name", "lookup", "record_key", "trust_known",
]

_MARKERS = frozenset({"@revoked", "@cert-authority"})


class HostKeyError(GpufleetError):
    """The host's key is unknown, revoked or differs from the recorded one; it is refused."""


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    """The name a host is recorded under in known_hosts."""
    return address if port == 22 else f"[{address}]:{port}"


@dataclass(frozen=True)
class KnownEntry:
    """One usable known_hosts line."""

    marker: str | None
    names: str
    key_type: str
    blob: bytes
    file: Path
    line: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def matches(self, name: str) -> bool:
        """Whether this line is about host ``name`` (as known_hosts_name writes it)."""
        if self.names.startswith("|1|"):
            return _hashed_match(self.names, name)
        return _pattern_list_match(name.lower(), self.names)

    def key(self) -> paramiko.PKey | None:
        """The key as paramiko knows it, or None for a type paramiko cannot use."""
        try:
            return paramiko.PKey.from_type_string(self.key_type, self.blob)
        except (paramiko.SSHException, ValueError, TypeError, IndexError):
            return None


@functools.lru_cache(maxsize=4096)
def _pattern(pattern: str) -> re.Pattern[str]:
    """An OpenSSH host pattern as a regular expression: ``*`` any run, ``?`` any one
    character, everything else literal (fnmatch would read ``[...]`` as a class)."""
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.compile("".join(parts), re.DOTALL)


def _pattern_list_match(name: str, patterns: str) -> bool:
    """match_hostname: a comma list matches when a positive pattern matches and no
    negated one does (a matching ``!pattern`` vetoes the whole line)."""
    found = False
    for pattern in patterns.split(","):
        negated = pattern.startswith("!")
        if _pattern(pattern.removeprefix("!")).fullmatch(name):
            if negated:
                return False
            found = True
    return found


def _hashed_match(names: str, name: str) -> bool:
    parts = names.split("|")
    if len(parts) != 4:
        return False
    try:
        salt, digest = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)


def parse_known_hosts(text: str, file: Path) -> list[KnownEntry]:
    """The usable lines of a known_hosts file (comments, blanks and broken lines skipped)."""
    entries: list[KnownEntry] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = None
        if fields[0].startswith("@"):
            if fields[0] not in _MARKERS:
                continue
            marker, fields = fields[0][1:], fields[1:]
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except (binascii.Error, ValueError):
            continue
        entries.append(KnownEntry(marker, fields[0], fields[1], blob, file, number))
    return entries


_record_lock = threading.Lock()
_cache_lock = threading.Lock()
_cache: dict[Path, tuple[int, int, list[KnownEntry]]] = {}


def known_entries(path: Path) -> list[KnownEntry]:
    """A known_hosts file's entries, parsed once per content (keyed by mtime and size): a
    fleet run connects to every host, and parsing a large file per connection costs
    O(hosts^2). The first of many threads asking at once parses it; the others wait for
    its result. Anything but a readable regular file holds no entries."""
    try:
        info = path.stat()
    except OSError:
        return []
    if not stat.S_ISREG(info.st_mode):
        return []
    with _cache_lock:
        cached = _cache.get(path)
        if cached and cached[:2] == (info.st_mtime_ns, info.st_size):
            return cached[2]
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return []
        entries = parse_known_hosts(text, path)
        _cache[path] = (info.st_mtime_ns, info.st_size, entries)
        return entries


@dataclass
class HostKeys:
    """What the known_hosts files say about one host name."""

    name: str
    keys: list[KnownEntry] = field(default_factory=list)
    revoked: list[KnownEntry] = field(default_factory=list)
    authorities: list[KnownEntry] = field(default_factory=list)

    def revocation(self, key: paramiko.PKey) -> KnownEntry | None:
        """The @revoked line that lists ``key``, if any."""
        blob = key.asbytes()
        return next((entry for entry in self.revoked if entry.blob == blob), None)


def lookup(name: str, files: list[Path]) -> HostKeys:
    """The host's recorded keys from the first file that has any (revoked ones left out),
    plus every @revoked and @cert-authority line about it in any file."""
    found = HostKeys(name)
    for path in files:
        entries = [entry for entry in known_entries(path) if entry.matches(name)]
        found.revoked += [entry for entry in entries if entry.marker == "revoked"]
        found.authorities += [entry for entry in entries if entry.marker == "cert-authority"]
        plain = [entry for entry in entries if entry.marker is None]
        if plain and not found.keys:
            found.keys = plain
    revoked = {entry.blob for entry in found.revoked}
    found.keys = [entry for entry in found.keys if entry.blob not in revoked]
    return found


def trust_known(client: paramiko.SSHClient, name: str, files: list[Path]) -> None:
    """Give ``client`` the recorded keys of ``name`` (as known_hosts names it) only."""
    for entry in lookup(name, files).keys:
        key = entry.key()
        if key is not None:
            client.get_host_keys().add(name, key.get_name(), key)


def _refuse_record(path: Path, name: str, why: str) -> HostKeyError:
    return HostKeyError(f"cannot record the host key of {name} in {path}: {why}; set "
                        "gpufleet_known_hosts in the inventory to the file gpufleet should "
                        "record keys in")


def record_key(path: Path, address: str, port: int, key: paramiko.PKey) -> None:
    """Append a host key to ``path`` atomically (temp file + rename), creating it if needed.

    A symlink is followed and its target replaced (the link stays); a path that is, or
    leads to, anything other than a regular file (``/dev/null``, a FIFO, a directory) is
    refused and left alone."""
    name = known_hosts_name(address, port)
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    target = Path(os.path.realpath(path))
    if target == Path(os.devnull):
        raise _refuse_record(path, name, f"it is {os.devnull}")
    with _record_lock:
        try:
            info = target.stat()
        except FileNotFoundError:
            info = None
        if info is not None and not stat.S_ISREG(info.st_mode):
            raise _refuse_record(path, name, "it is not a regular file")
        target.parent.mkdir(parents=True, exist_ok=True)
        old = target.read_text() if info is not None else ""
        if old and not old.endswith("\n"):
            old += "\n"
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".gpufleet-tmp",
                                   dir=target.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(old + line)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, stat.S_IMODE(info.st_mode) if info is not None else 0o644)
            if info is not None and os.geteuid() == 0:
                os.chown(tmp, info.st_uid, info.st_gid)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class VerifyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys unless trust on first use was explicitly asked for; refuse
    revoked keys and hosts known only through a @cert-authority line.

    Keys that are recorded but differ never reach a policy: paramiko raises
    BadHostKeyException for them, and gpufleet refuses the host. On a port other than 22,
    as ssh does, a host not recorded as ``[address]:port`` is accepted when it presents a
    key recorded for the bare address (a revocation under either name refuses it).
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
        known = lookup(hostname, self.files)
        address, port = _split_name(hostname)
        bare = lookup(address, self.files) if port != 22 else HostKeys(address)
        revoked = known.revocation(key) or bare.revocation(key)
        if revoked is not None:
            raise HostKeyError(f"host key of {hostname} ({key.get_name()} {fp}) is revoked "
                               f"(@revoked at {revoked.where}); refusing to connect")
        if any(entry.blob == key.asbytes() for entry in bare.keys):
            # ssh's "found matching key w/out port": the same key recorded for the bare
            # address vouches for another port; a different one there is no verdict.
            client.get_host_keys().add(hostname, key.get_name(), key)
            return
        if known.authorities:
            raise HostKeyError(
                f"host key of {hostname} ({key.get_name()} {fp}) is vouched for only by a "
                f"@cert-authority line ({known.authorities[0].where}), and gpufleet does not "
                "verify host certificates; record the host's own key in known_hosts")
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
            record_key(self.record_to, address, port, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.accepted = fp


def _split_name(hostname: str) -> tuple[str, int]:
    if hostname.startswith("[") and "]:" in hostname:
        address, port = hostname[1:].split("]:", 1)
        return address, int(port)
    return hostname, 22


def changed_key_message(exc: paramiko.BadHostKeyException, files: list[Path],
                        names: list[str] | None = None) -> str:
    """A clear message for a host whose key changed (or was revoked).

    paramiko names the host by its bare address even on another port; ``names`` are the
    known_hosts names the connection looked up (``[address]:port``), and the one whose
    recorded keys hold the key paramiko expected is the host's."""
    name = _looked_up(exc, files, names or [])
    revoked = lookup(name, files).revocation(exc.key)
    if revoked is not None:
        return (f"host key of {name} ({exc.key.get_name()} {fingerprint(exc.key)}) is "
                f"revoked (@revoked at {revoked.where}); refusing to connect")
    known = lookup(name, files).keys
    where = known[0].file if known else ", ".join(str(f) for f in files)
    return (f"HOST KEY CHANGED for {name}: known_hosts ({where}) has "
            f"{fingerprint(exc.expected_key)}, the host presented {fingerprint(exc.key)}; "
            "refusing to connect (if the node was reinstalled, remove its old line)")


def _looked_up(exc: paramiko.BadHostKeyException, files: list[Path], names: list[str]) -> str:
    expected = exc.expected_key.asbytes()
    for name in names:
        if _split_name(name)[0] == exc.hostname and any(
                entry.blob == expected for entry in lookup(name, files).keys):
            return name
    return str(exc.hostname)
