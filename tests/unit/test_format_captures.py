"""The readers of formats.py that read a tool's own output (``chronyc tracking`` through
the time_sync snippet, ``df -Pk``), held to published captures (tests/fixtures/published,
sources in its README)."""

from __future__ import annotations

import pytest

from gpufleet.errors import ParseError
from gpufleet.facts.formats import disk_free, time_sync
from tests.conftest import ROOT

PUBLISHED = ROOT / "tests" / "fixtures" / "published"


@pytest.mark.parametrize(("name", "offset_s"), [
    ("chronyc-tracking-scale-network-121.txt", 0.000260112),
    ("chronyc-tracking-rockstor-2098.txt", -0.000052616),
    ("chronyc-tracking-omnios-2576.txt", -7.810536861),
])
def test_chronyc_tracking_with_leap_status_normal_is_synchronised(name: str,
                                                                   offset_s: float) -> None:
    """Debian, openSUSE Leap 15 and illumos chronyd, each behind its prompt line (left out
    here: the snippet prints chronyc's output alone). The omnios one is 7.8 s slow with Leap
    status Normal: chrony calls that synchronised, so the reader does too, and keeps the
    offset, which the clock suite and the health check bound."""
    lines = (PUBLISHED / name).read_text().splitlines()
    output = "\n".join(lines[next(i for i, line in enumerate(lines)
                                  if line.startswith("Reference ID")):]) + "\n"
    value = time_sync("@chronyc\n" + output)
    assert (value["source"], value["synchronised"]) == ("chrony", True)
    assert value["offset_s"] == pytest.approx(offset_s)


def test_df_of_gnu_coreutils_and_busybox() -> None:
    """GNU df on the H200 node and BusyBox df (Alpine) on a CIFS mount whose long source
    name pushes the columns apart."""
    assert disk_free((ROOT / "tests" / "fixtures" / "h200x2" / "df.txt").read_text()) == {
        "/": 134200724 * 1024}
    # The capture's first line is the shell prompt that ran df.
    busybox = (PUBLISHED / "df-kP-busybox-cifs-sindresorhus-df-16.txt").read_text()
    busybox = busybox.split("\n", 1)[1]
    assert disk_free(busybox) == {"/data0": 9831279476 * 1024}


def test_disk_free_reads_mount_points_with_spaces_and_refuses_a_row_it_cannot_read() -> None:
    header = "Filesystem 1024-blocks Used Available Capacity Mounted on\n"
    assert disk_free(header + "/dev/sdb1 100 40 60 40% /mnt/data set\n"
                     "df: /opt: No such file or directory\n"
                     "tmpfs - - - - /run/x\n") == {"/mnt/data set": 60 * 1024}
    with pytest.raises(ParseError, match="without a free-space figure"):
        disk_free(header + "/dev/sda1 100 40 60 40% /\n/dev/sdb1 100 40 6O 40% /var\n")
