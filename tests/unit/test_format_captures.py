"""The readers of formats.py that read a tool's own output (``chronyc tracking``, ``df
-Pk``), held to published captures (tests/fixtures/published, sources in its README)."""

from __future__ import annotations

import pytest

from gpufleet.facts.formats import disk_free, time_sync
from tests.conftest import ROOT

PUBLISHED = ROOT / "tests" / "fixtures" / "published"


@pytest.mark.parametrize("name", [
    "chronyc-tracking-scale-network-121.txt",
    "chronyc-tracking-rockstor-2098.txt",
    "chronyc-tracking-omnios-2576.txt",
])
def test_chronyc_tracking_with_leap_status_normal_is_synchronised(name: str) -> None:
    """Debian, openSUSE Leap 15 and illumos chronyd, each behind its prompt line. The omnios
    one is 7.8 s slow with Leap status Normal: chrony calls that synchronised, so the reader
    does too, and the bootstrap's clock-skew check against the controller still applies."""
    assert time_sync((PUBLISHED / name).read_text()) is True


def test_df_of_gnu_coreutils_and_busybox() -> None:
    """GNU df on the H200 node and BusyBox df (Alpine) on a CIFS mount whose long source
    name pushes the columns apart."""
    assert disk_free((ROOT / "tests" / "fixtures" / "h200x2" / "df.txt").read_text()) == {
        "/": 134200724 * 1024}
    busybox = (PUBLISHED / "df-kP-busybox-cifs-sindresorhus-df-16.txt").read_text()
    assert disk_free(busybox) == {"/data0": 9831279476 * 1024}
