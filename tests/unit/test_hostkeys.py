"""Host keys: fingerprints as ssh-keygen prints them, known_hosts records, trust policy."""

from __future__ import annotations

import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko
import pytest

from gpufleet.connect import hostkeys
from gpufleet.connect.hostkeys import (
    HostKeyError,
    VerifyPolicy,
    changed_key_message,
    fingerprint,
    known_hosts_name,
    record_key,
)

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None,
                                reason="ssh-keygen is not installed")

KEY_TYPES = [("ed25519", []), ("ecdsa", ["-b", "256"]), ("rsa", ["-b", "2048"])]


def keygen(directory: Path, kind: str, extra: list[str] | None = None) -> Path:
    path = directory / f"id_{kind}"
    subprocess.run(["ssh-keygen", "-q", "-t", kind, *(extra or []), "-N", "", "-C", "test",
                    "-f", str(path)], check=True, timeout=60, capture_output=True)
    return path


def ssh_keygen_fingerprint(public: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(public)], check=True, capture_output=True,
                         text=True, timeout=30).stdout
    return out.split()[1]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("keys")
    return {kind: keygen(directory, kind, extra) for kind, extra in KEY_TYPES}


@pytest.mark.parametrize("kind", [k for k, _ in KEY_TYPES])
def test_fingerprint_matches_ssh_keygen(keys: dict[str, Path], kind: str) -> None:
    key = paramiko.PKey.from_path(keys[kind])
    expected = ssh_keygen_fingerprint(keys[kind].with_suffix(".pub"))
    assert expected.startswith("SHA256:")
    assert fingerprint(key) == expected
    assert len(fingerprint(key)) == len("SHA256:") + 43  # 32 bytes, base64 without padding


def test_known_hosts_name() -> None:
    assert known_hosts_name("10.0.0.5", 22) == "10.0.0.5"
    assert known_hosts_name("10.0.0.5", 2222) == "[10.0.0.5]:2222"
    assert known_hosts_name("gpu01.example", 22) == "gpu01.example"
    assert known_hosts_name("fd00::5", 2200) == "[fd00::5]:2200"


def test_record_key_writes_bracketed_names_for_other_ports(keys: dict[str, Path],
                                                           tmp_path: Path) -> None:
    ed = paramiko.PKey.from_path(keys["ed25519"])
    rsa = paramiko.PKey.from_path(keys["rsa"])
    known = tmp_path / "new dir" / "known_hosts"
    record_key(known, "10.0.0.5", 22, ed)
    record_key(known, "10.0.0.5", 2222, rsa)
    assert known.read_text() == (
        f"10.0.0.5 ssh-ed25519 {ed.get_base64()}\n"
        f"[10.0.0.5]:2222 ssh-rsa {rsa.get_base64()}\n")
    assert known.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in known.parent.iterdir()) == ["known_hosts"]
    # OpenSSH and paramiko both find the entries under the names ssh uses
    for name, key in (("10.0.0.5", ed), ("[10.0.0.5]:2222", rsa)):
        found = subprocess.run(["ssh-keygen", "-F", name, "-f", str(known)],
                               capture_output=True, text=True, timeout=30, check=False)
        assert found.returncode == 0, found.stderr
        assert key.get_base64() in found.stdout
    loaded = paramiko.HostKeys(str(known))
    assert loaded.lookup("[10.0.0.5]:2222")["ssh-rsa"] == rsa  # type: ignore[index]
    assert loaded.lookup("10.0.0.5")["ssh-ed25519"] == ed  # type: ignore[index]
    assert loaded.lookup("[10.0.0.5]:22") is None


def test_record_key_appends_after_a_line_without_newline(keys: dict[str, Path],
                                                         tmp_path: Path) -> None:
    key = paramiko.PKey.from_path(keys["ecdsa"])
    known = tmp_path / "known_hosts"
    known.write_text("old.example ssh-ed25519 AAAAold")
    record_key(known, "fd00::5", 2200, key)
    assert known.read_text() == (f"old.example ssh-ed25519 AAAAold\n"
                                 f"[fd00::5]:2200 ecdsa-sha2-nistp256 {key.get_base64()}\n")


def test_policy_refuses_unknown_keys_by_default(keys: dict[str, Path], tmp_path: Path) -> None:
    key = paramiko.PKey.from_path(keys["ed25519"])
    known = tmp_path / "known_hosts"
    policy = VerifyPolicy([known], record_to=known)
    client = paramiko.SSHClient()
    with pytest.raises(HostKeyError) as caught:
        policy.missing_host_key(client, "[10.0.0.5]:2222", key)
    assert str(caught.value) == (
        f"host key of [10.0.0.5]:2222 (ssh-ed25519 {fingerprint(key)}) is not in known_hosts "
        f"({known}); verify the fingerprint, then trust it with --accept-new-host-keys or "
        "`invoke bootstrap`")
    assert not known.exists()
    assert policy.accepted is None
    with pytest.raises(HostKeyError, match=r"\(no known_hosts file\)"):
        VerifyPolicy([]).missing_host_key(client, "h", key)


def test_policy_accepts_and_records_new_keys_when_asked(keys: dict[str, Path],
                                                        tmp_path: Path) -> None:
    key = paramiko.PKey.from_path(keys["ed25519"])
    known = tmp_path / "known_hosts"
    policy = VerifyPolicy([known], accept_new=True, record_to=known)
    client = paramiko.SSHClient()
    policy.missing_host_key(client, "[10.0.0.5]:2222", key)
    assert policy.accepted == fingerprint(key)
    assert known.read_text() == f"[10.0.0.5]:2222 ssh-ed25519 {key.get_base64()}\n"
    assert client.get_host_keys().lookup("[10.0.0.5]:2222")["ssh-ed25519"] == key  # type: ignore[index]


def test_policy_refuses_a_key_other_than_the_expected_fingerprint(
        keys: dict[str, Path], tmp_path: Path) -> None:
    key = paramiko.PKey.from_path(keys["ed25519"])
    other = fingerprint(paramiko.PKey.from_path(keys["rsa"]))
    known = tmp_path / "known_hosts"
    policy = VerifyPolicy([known], accept_new=True, record_to=known, expect_fingerprint=other)
    with pytest.raises(HostKeyError) as caught:
        policy.missing_host_key(paramiko.SSHClient(), "gpu01", key)
    assert str(caught.value) == (f"host key of gpu01 is ssh-ed25519 {fingerprint(key)}, not the "
                                 f"expected {other}; refusing to connect")
    assert not known.exists()


def test_changed_key_message_names_both_fingerprints(keys: dict[str, Path]) -> None:
    old = paramiko.PKey.from_path(keys["ed25519"])
    new = paramiko.PKey.from_path(keys["ecdsa"])
    exc = paramiko.BadHostKeyException("gpu01", new, old)
    assert changed_key_message(exc, [Path("/a/known_hosts"), Path("/b/known_hosts")]) == (
        f"HOST KEY CHANGED for gpu01: known_hosts (/a/known_hosts, /b/known_hosts) has "
        f"{fingerprint(old)}, the host presented {fingerprint(new)}; refusing to connect "
        "(if the node was reinstalled, remove its old line)")


def test_many_threads_parse_known_hosts_once(keys: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    public = keys["ed25519"].with_suffix(".pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text("".join(f"10.9.{i // 250}.{i % 250} {public[0]} {public[1]}\n"
                             for i in range(1000)))
    parses: list[Path] = []
    parse = hostkeys.parse_known_hosts

    def counting(text: str, file: Path) -> list[hostkeys.KnownEntry]:
        parses.append(file)
        return parse(text, file)

    monkeypatch.setattr(hostkeys, "parse_known_hosts", counting)
    start = threading.Barrier(32)

    def look(i: int) -> bool:
        start.wait()
        return bool(hostkeys.lookup(f"10.9.0.{i}", [known]).keys)

    with ThreadPoolExecutor(32) as pool:
        assert all(pool.map(look, range(32)))
    assert parses == [known]
    known.write_text(known.read_text() + f"10.9.9.9 {public[0]} {public[1]}\n")
    assert hostkeys.lookup("10.9.9.9", [known]).keys
    assert len(parses) == 2
