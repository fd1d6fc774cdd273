"""known_hosts as OpenSSH reads it (markers, hashed names, patterns), pinned files first, and
recording that never replaces /dev/null or a link."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import shutil
import stat
import subprocess
from pathlib import Path

import paramiko
import pytest

from gpufleet.connect import hostkeys
from gpufleet.connect.hostkeys import HostKeyError, VerifyPolicy, fingerprint, lookup, record_key
from gpufleet.connect.ssh import known_hosts_files
from gpufleet.inventory.load import load_inventory

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None,
                                reason="ssh-keygen is not installed")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> list[paramiko.PKey]:
    directory = tmp_path_factory.mktemp("keys")
    found = []
    for index in range(3):
        path = directory / f"id_{index}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f",
                        str(path)], check=True, timeout=60, capture_output=True)
        found.append(paramiko.PKey.from_path(path))
    return found


def line(names: str, key: paramiko.PKey, marker: str = "") -> str:
    return f"{marker + ' ' if marker else ''}{names} {key.get_name()} {key.get_base64()}\n"


def hashed(name: str) -> str:
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def found_keys(name: str, files: list[Path]) -> list[str]:
    return [entry.blob.hex()[-8:] for entry in lookup(name, files).keys]


def blob(key: paramiko.PKey) -> str:
    return key.asbytes().hex()[-8:]


def test_markers_hashed_names_patterns_and_broken_lines(keys: list[paramiko.PKey],
                                                        tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(
        "# a comment\n\n"
        "garbage\n"
        "gpu01 ssh-ed25519 !!!not-base64!!!\n"
        "@unknown-marker gpu01 ssh-ed25519 AAAA\n"
        + line(hashed("gpu01.example"), keys[0])
        + line("*.lab,!bad.lab", keys[1])
        + line("[gpu02]:2222", keys[2])
        + line("*", keys[2], "@revoked")
        + line("*.ca.example", keys[0], "@cert-authority"))
    assert found_keys("gpu01.example", [known]) == [blob(keys[0])]
    assert found_keys("n1.lab", [known]) == [blob(keys[1])]
    assert found_keys("N1.LAB", [known]) == [blob(keys[1])]
    assert found_keys("bad.lab", [known]) == []
    assert found_keys("[gpu02]:2222", [known]) == []  # its only key is revoked
    assert lookup("[gpu02]:2222", [known]).revocation(keys[2]) is not None
    assert [e.line for e in lookup("x.ca.example", [known]).authorities] == [10]
    assert lookup("other", [known]).authorities == []


def test_brackets_are_literal_and_only_star_and_question_mark_are_wildcards(
        keys: list[paramiko.PKey], tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(line("[10.0.0.5]:2222", keys[0]) + line("[10.0.1.?]:22*", keys[1]))
    assert found_keys("[10.0.0.5]:2222", [known]) == [blob(keys[0])]
    assert found_keys("1:2222", [known]) == []  # fnmatch would read [10.0.0.5] as a class
    assert found_keys("10.0.0.5", [known]) == []
    assert found_keys("[10.0.1.7]:2200", [known]) == [blob(keys[1])]


def test_the_first_file_that_knows_a_host_decides(keys: list[paramiko.PKey],
                                                  tmp_path: Path) -> None:
    pinned, home = tmp_path / "pinned", tmp_path / "home"
    pinned.write_text(line("gpu01", keys[0]))
    home.write_text(line("gpu01", keys[1]) + line("gpu02", keys[1]))
    assert found_keys("gpu01", [pinned, home]) == [blob(keys[0])]
    assert found_keys("gpu02", [pinned, home]) == [blob(keys[1])]
    client = paramiko.SSHClient()
    hostkeys.trust_known(client, "gpu01", [pinned, home])
    assert client.get_host_keys().lookup("gpu01") == {"ssh-ed25519": keys[0]}


def test_a_revoked_key_is_refused_even_when_new_keys_are_accepted(
        keys: list[paramiko.PKey], tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(line("gpu01", keys[0]) + line("gpu01,gpu02", keys[0], "@revoked"))
    policy = VerifyPolicy([known], accept_new=True, record_to=known)
    for name in ("gpu01", "gpu02"):
        with pytest.raises(HostKeyError) as caught:
            policy.missing_host_key(paramiko.SSHClient(), name, keys[0])
        assert str(caught.value) == (f"host key of {name} (ssh-ed25519 {fingerprint(keys[0])}) "
                                     f"is revoked (@revoked at {known}:2); refusing to connect")
    assert known.read_text().count("\n") == 2
    exc = paramiko.BadHostKeyException("gpu01", keys[0], keys[1])
    assert hostkeys.changed_key_message(exc, [known]).endswith(
        f"is revoked (@revoked at {known}:2); refusing to connect")


def test_a_host_known_only_through_a_cert_authority_is_unsupported_alone(
        keys: list[paramiko.PKey], tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(line("*.ca.example", keys[0], "@cert-authority") + line("n2.ca.example",
                                                                             keys[2]))
    policy = VerifyPolicy([known], accept_new=True, record_to=known)
    with pytest.raises(HostKeyError) as caught:
        policy.missing_host_key(paramiko.SSHClient(), "n1.ca.example", keys[1])
    assert str(caught.value) == (
        f"host key of n1.ca.example (ssh-ed25519 {fingerprint(keys[1])}) is vouched for only "
        f"by a @cert-authority line ({known}:1), and gpufleet does not verify host "
        "certificates; record the host's own key in known_hosts")
    assert found_keys("n2.ca.example", [known]) == [blob(keys[2])]
    policy.missing_host_key(paramiko.SSHClient(), "plain.example", keys[1])
    assert "plain.example" in known.read_text()


def test_dev_null_is_refused_as_a_place_to_record(keys: list[paramiko.PKey],
                                                  tmp_path: Path) -> None:
    before = os.stat(os.devnull)
    link = tmp_path / "known_hosts"
    link.symlink_to(os.devnull)
    for target in (Path(os.devnull), link):
        with pytest.raises(HostKeyError) as caught:
            record_key(target, "gpu01", 22, keys[0])
        assert str(caught.value) == (
            f"cannot record the host key of gpu01 in {target}: it is /dev/null; set "
            "gpufleet_known_hosts in the inventory to the file gpufleet should record keys in")
    after = os.stat(os.devnull)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["known_hosts"]


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_other_non_regular_files_are_refused(keys: list[paramiko.PKey], tmp_path: Path,
                                             kind: str) -> None:
    target = tmp_path / "known_hosts"
    os.mkfifo(target) if kind == "fifo" else target.mkdir()
    with pytest.raises(HostKeyError, match="it is not a regular file"):
        record_key(target, "gpu01", 22, keys[0])
    assert stat.S_ISFIFO(target.stat().st_mode) if kind == "fifo" else target.is_dir()


def test_recording_through_a_symlink_keeps_the_link(keys: list[paramiko.PKey],
                                                    tmp_path: Path) -> None:
    real = tmp_path / "shared" / "known_hosts"
    real.parent.mkdir()
    real.write_text(line("old", keys[1]))
    real.chmod(0o600)
    link = tmp_path / "known_hosts"
    link.symlink_to(real)
    record_key(link, "gpu01", 2222, keys[0])
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == line("old", keys[1]) + line("[gpu01]:2222", keys[0])
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    assert sorted(p.name for p in real.parent.iterdir()) == ["known_hosts"]


def test_recording_through_a_dangling_symlink_creates_its_target(keys: list[paramiko.PKey],
                                                                 tmp_path: Path) -> None:
    link = tmp_path / "known_hosts"
    link.symlink_to(tmp_path / "state" / "known_hosts")
    record_key(link, "gpu01", 22, keys[0])
    assert link.is_symlink()
    assert (tmp_path / "state" / "known_hosts").read_text() == line("gpu01", keys[0])


def test_user_known_hosts_file_dev_null_with_accept_new(keys: list[paramiko.PKey],
                                                        tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("gpu01 ansible_ssh_common_args='-o UserKnownHostsFile=/dev/null "
                         "-o StrictHostKeyChecking=no'\n")
    host = load_inventory(inventory).hosts["gpu01"]
    files = known_hosts_files(host, tmp_path)
    assert files[:1] == [Path(os.devnull)]
    policy = VerifyPolicy(files, accept_new=True, record_to=files[0])
    with pytest.raises(HostKeyError, match="in /dev/null: it is /dev/null; set gpufleet_known"):
        policy.missing_host_key(paramiko.SSHClient(), "gpu01", keys[0])
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_known_hosts_files_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    inventory = tmp_path / "inv" / "hosts.ini"
    inventory.parent.mkdir()
    inventory.write_text("gpu01 gpufleet_known_hosts=pinned "
                         "ansible_ssh_common_args='-oUserKnownHostsFile=\"~/a /b\"' "
                         "ansible_ssh_extra_args='-o UserKnownHostsFile=/ignored'\n")
    host = load_inventory(inventory).hosts["gpu01"]
    assert known_hosts_files(host, inventory.parent) == [
        inventory.parent.absolute() / "pinned", tmp_path / "home" / "a", Path("/b"),
        tmp_path / "home" / ".ssh" / "known_hosts"]
