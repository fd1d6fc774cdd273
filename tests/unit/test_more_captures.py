"""Readers held to more real captures of their tools: the DCGM diagnostic's third document,
the sysfs, sysctl and /sys/class/net readers on a Debian 12 machine, published RDMA port
rates and sysfs listings, and ``mokutil --sb-state`` as published (sources, machines and
versions in tests/fixtures/published/README.md and tests/fixtures/nvidia/README.md)."""

from __future__ import annotations

import pytest

from gpufleet.facts.parsers import system
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
PUBLISHED = FIXTURES / "published"


def published(name: str) -> str:
    return (PUBLISHED / name).read_text()


# --------------------------------------------------------------------------- mokutil --sb-state

@pytest.mark.parametrize(("name", "enforced"), [
    ("mokutil-sb-state-enabled-sos-1574.txt", True),
    ("mokutil-sb-state-disabled-hwameistor.txt", False),
    ("mokutil-sb-state-shim-validation-disabled-holoscan.txt", False),
])
def test_secure_boot_as_mokutil_prints_it(name: str, enforced: bool) -> None:
    assert system.secure_boot(published(name)) is enforced
