"""Debian version ordering, as dpkg --compare-versions does it."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gpufleet.provision import debversion

# (a, b, sign of compare(a, b))
ORDER = [
    # real NVIDIA driver, CUDA and NCCL package versions
    ("550.127.05-0ubuntu1", "550.144.03-0ubuntu1", -1),
    ("550.54.15-0ubuntu1", "550.54.15-0ubuntu0.22.04.1", 1),
    ("565.57.01-0ubuntu1", "565.57.01-1", -1),
    ("550.127.05-1", "565.57.01-1", -1),
    ("2.21.5-1+cuda12.4", "2.23.4-1+cuda12.6", -1),
    ("2.21.5-1+cuda12.4", "2.21.5-1+cuda12.6", -1),
    ("2.21.5-1+cuda12.6", "2.21.5-1+cuda12.10", -1),
    ("12.4.1-1", "12.6.2-1", -1),
    ("12.6.2-1", "12.6.3-1", -1),
    ("12.4.1-1", "12.4.1-1", 0),
    # epochs
    ("1:1.0", "2.0", 1),
    ("2:0.1", "1:9.9", 1),
    ("0:1.0", "1.0", 0),
    ("1:550.54.15-1", "550.54.15-1", 1),
    # tildes sort before everything, even the end of the string
    ("1.0~rc1", "1.0", -1),
    ("1.0~rc1", "1.0~rc2", -1),
    ("1.0~~", "1.0~", -1),
    ("1.0~", "1.0", -1),
    ("1.0~rc1-1", "1.0-1", -1),
    # letters before non-letters, the end before letters
    ("1.0", "1.0a", -1),
    ("1.0a", "1.0+", -1),
    ("1.0+dfsg", "1.0", 1),
    ("1.0a", "1.0b", -1),
    # numbers compare numerically, leading zeros ignored
    ("1.2.10", "1.2.9", 1),
    ("1.002", "1.2", 0),
    ("1.0.0", "1.0", 1),
    ("10", "9", 1),
    # revisions: after the last hyphen; absent equals "0"
    ("1.0-1", "1.0-2", -1),
    ("1.0-1ubuntu1", "1.0-1", 1),
    ("1.0", "1.0-0", 0),
    ("1.0-beta-2", "1.0-beta-10", -1),
    ("1.0-beta-2", "1.0-alpha-2", 1),
]


def sign(n: int) -> int:
    return (n > 0) - (n < 0)


@pytest.mark.parametrize(("a", "b", "expected"), ORDER)
def test_compare(a: str, b: str, expected: int) -> None:
    assert sign(debversion.compare(a, b)) == expected
    assert sign(debversion.compare(b, a)) == -expected


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="dpkg is not installed")
def test_table_agrees_with_dpkg() -> None:
    for a, b, expected in ORDER:
        op = {-1: "lt", 0: "eq", 1: "gt"}[expected]
        proc = subprocess.run(["dpkg", "--compare-versions", a, op, b], check=False)
        assert proc.returncode == 0, f"dpkg disagrees: {a} {op} {b}"


def test_sort_key_orders_like_dpkg() -> None:
    versions = ["2.23.4-1+cuda12.6", "1:0.1", "2.21.5-1+cuda12.4", "2.21.5~rc1-1+cuda12.4",
                "2.21.5-1+cuda12.4a", "2.3-1"]
    assert sorted(versions, key=debversion.sort_key) == [
        "2.3-1", "2.21.5~rc1-1+cuda12.4", "2.21.5-1+cuda12.4", "2.21.5-1+cuda12.4a",
        "2.23.4-1+cuda12.6", "1:0.1"]


def test_colon_inside_the_upstream_version() -> None:
    assert debversion.compare("1:2.0:3-1", "1:2.0:2-1") > 0
