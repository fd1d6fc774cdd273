"""Shared mounts: mountinfo captured with real bind mounts (tests/fixtures/mounts/README
says how), the shared_mounts declaration refused with the entry and key, and the verdicts
on one node's mounts and on a group's network filesystems."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.conformance.checks.mounts import (
    Mount,
    SharedMount,
    declared,
    group_differences,
    majority,
    mount_problems,
    mounted_at,
    network_mounts,
    parse_mountinfo,
)
from tests.conftest import FIXTURES

MOUNTINFO = (FIXTURES / "mounts" / "mountinfo-binds.txt").read_text()


def test_mountinfo_gives_targets_sources_with_their_directory_and_options() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    data, ro, spaced = (mounted_at(mounts, p) for p in ("/mnt/data", "/mnt/ro", "/mnt/sp ace"))
    assert data == Mount("/mnt/data", "/dev/vda[/tmp/mcap/a]", "ext4", data.options)  # type: ignore[union-attr]
    assert "rw" in data.options and "discard" in data.options  # type: ignore[union-attr]
    assert ro is not None and "ro" in ro.options and "rw" not in ro.options
    assert spaced is not None and spaced.source == "/dev/vda[/tmp/mcap/with space]"
    assert mounted_at(mounts, "/").source == "/dev/vda"  # type: ignore[union-attr]
    assert mounted_at(mounts, "/mnt/missing") is None


def test_the_declaration_is_refused_with_the_entry_and_key() -> None:
    assert declared([{"path": "/data/", "options": "rw,noatime", "writable": True}], "x") == [
        SharedMount("/data", None, None, ("rw", "noatime"), True)]
    for value, message in [
            ("/data", "x: a list of mappings, got str"),
            ([{"path": "data"}], "x[0].path: an absolute path, got 'data'"),
            ([{"path": "/d", "sorce": "nfs:/e"}], "x[0]: unknown key 'sorce'"),
            ([{"path": "/d", "writable": "yes"}], "x[0].writable: true or false, got 'yes'"),
            ([{"path": "/d"}, 3], "x[1]: a mapping with path")]:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            declared(value, "x")


def test_one_nodes_mounts_against_the_declaration_and_the_others() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    entry = SharedMount("/mnt/ro", "nfs4", None, ("noatime",), True)
    assert mount_problems(entry, mounted_at(mounts, "/mnt/ro"), "fs1:/export") == [
        "/mnt/ro is ext4, expected nfs4",
        "/mnt/ro is mounted from /dev/vda[/tmp/mcap/b], the other nodes mount fs1:/export",
        "/mnt/ro lacks option(s) noatime (has discard,relatime,resgid=65534,resuid=65534,"
        "resv_strict,ro)",
        "/mnt/ro is mounted read-only, declared writable"]
    assert mount_problems(SharedMount("/mnt/x"), None, None) == ["/mnt/x is not mounted"]
    good = SharedMount("/mnt/data", "ext4", "/dev/vda[/tmp/mcap/a]", ("rw",), True)
    assert mount_problems(good, mounted_at(mounts, "/mnt/data"), "other") == []
    assert majority(["a", "a", "b"]) == "a" and majority(["a", "b"]) is None


def test_network_filesystems_compared_within_a_group() -> None:
    nfs = Mount("/data", "fs1:/export", "nfs4", frozenset({"rw"}))
    lustre = Mount("/scratch", "10.0.0.1@tcp:/lfs", "lustre", frozenset({"rw"}))
    local = Mount("/tmp", "tmpfs", "tmpfs", frozenset({"rw"}))
    usual = network_mounts([nfs, lustre, local])
    assert usual == {("/data", "nfs4", "fs1:/export"), ("/scratch", "lustre",
                                                        "10.0.0.1@tcp:/lfs")}
    odd = network_mounts([Mount("/data", "fs2:/export", "nfs4", frozenset()), local])
    assert group_differences(odd, [usual, usual, odd]) == [
        "missing /data (nfs4 from fs1:/export)", "missing /scratch (lustre from 10.0.0.1@tcp:/lfs)",
        "extra /data (nfs4 from fs2:/export)"]
    assert group_differences(usual, [usual, usual, odd]) == []


def test_a_bad_declaration_stops_the_run_before_any_host_naming_file_and_line(
        tmp_path: Path) -> None:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu07: {ansible_host: 127.0.0.1}\n")
    (tmp_path / "group_vars" / "all.yml").write_text(
        "shared_mounts:\n  - {path: /datasets}\n  - {path: /ckpt, sorce: 'fs1:/e'}\n"
        "net_mtu: 100\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert app.conformance_cmd(str(tmp_path), suites="mounts,network") == 2
    assert err.getvalue().splitlines() == [
        "error: host gpu07: shared_mounts[1]: unknown key 'sorce' (keys: fstype, options, "
        f"path, source, writable) ({tmp_path}/group_vars/all.yml:1); host gpu07: variable "
        f"net_mtu must be an MTU from 576 to 65535, got 100 ({tmp_path}/group_vars/all.yml:4)"]
