"""The storage probe: ``need_mbps``, and real runs on small files in a temporary directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from gpufleet.suites.probes.storage import EXIT_PATH, GIB, KIB, TEST_DIR, main, need_mbps
from tests.probe_runs import PROBES

PROBE = PROBES / "storage.py"
SMALL = ["--file-gb", str(8 / 1024), "--readers", "2", "--small-files", "50"]
SMALL += ["--small-kb", "4", "--block-mb", "1"]


def probe(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]]]:
    code = main(list(argv))
    return code, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def files(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under ``root``: its inode, size and modification time."""
    found = {}
    for path in root.rglob("*"):
        if path.is_file():
            status = path.stat()
            found[str(path.relative_to(root))] = (status.st_ino, status.st_size, status.st_mtime_ns)
    return found


def test_need_mbps() -> None:
    # 36 TB in a 60-minute epoch over 10 nodes: 1 GB/s each.
    assert need_mbps(36_000, 60, 10) == pytest.approx(1000.0)
    assert need_mbps(1.5, 0.5, 1) == pytest.approx(50.0)
    assert need_mbps(0, 10, 4) == 0.0


@pytest.mark.parametrize(("gb", "minutes", "nodes"), [(-1, 1, 1), (1, 0, 1), (1, 1, 0)])
def test_need_mbps_rejects(gb: float, minutes: float, nodes: int) -> None:
    with pytest.raises(ValueError):
        need_mbps(gb, minutes, nodes)


def test_runs_reuse_the_files_and_cleanup_removes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = probe(capsys, "--path", str(tmp_path), *SMALL)
    assert code == 0
    [result] = lines
    assert result["event"] == "result"
    assert result["path"] == str(tmp_path.resolve())
    assert result["readers"] == 2
    assert result["bytes_read"] == 2 * int(8 / 1024 * GIB)
    assert result["small_files"] == 50
    assert result["created_files"] == 52
    assert result["cache_dropped"] is True
    assert "note" not in result
    for key in ("seq_read_mbps", "small_files_per_s", "small_read_mbps"):
        assert result[key] > 0
    assert result["small_read_mbps"] == pytest.approx(result["small_files_per_s"] * 4 * KIB / 1e6)

    root = tmp_path / TEST_DIR
    first = files(root)
    assert len(first) == 52
    assert first["seq-0.bin"][1] == first["seq-1.bin"][1] == 8 * 1024**2
    assert {size for _, size, _ in first.values()} == {8 * 1024**2, 4 * KIB}
    contents = {(root / name).read_bytes() for name in first}
    assert len(contents) == 52  # no two files alike, so no storage can deduplicate them

    code, lines = probe(capsys, "--path", str(tmp_path), *SMALL)
    assert code == 0
    assert lines[0]["created_files"] == 0
    assert files(root) == first

    code, lines = probe(capsys, "--path", str(tmp_path), "--cleanup")
    assert code == 0
    assert lines == [{"event": "cleanup", "path": str(root.resolve()), "removed": True}]
    assert not root.exists()
    code, lines = probe(capsys, "--path", str(tmp_path), "--cleanup")
    assert (code, lines[0]["removed"]) == (0, False)


def test_a_short_file_is_written_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert probe(capsys, "--path", str(tmp_path), *SMALL)[0] == 0
    root = tmp_path / TEST_DIR
    whole = (root / "seq-1.bin").read_bytes()
    (root / "seq-1.bin").write_bytes(whole[: len(whole) // 2])
    code, lines = probe(capsys, "--path", str(tmp_path), *SMALL)
    assert (code, lines[0]["created_files"]) == (0, 1)
    assert (root / "seq-1.bin").read_bytes() == whole
    assert not [path for path in root.rglob("*.tmp")]


def test_missing_path_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = probe(capsys, "--path", str(tmp_path / "absent"), *SMALL)
    assert code == EXIT_PATH
    [error] = lines
    assert error["event"] == "error"
    assert "does not exist" in error["message"]
    assert probe(capsys, "--path", str(tmp_path / "absent"), "--cleanup")[0] == EXIT_PATH
    (tmp_path / "file").touch()
    assert probe(capsys, "--path", str(tmp_path / "file"), *SMALL)[0] == EXIT_PATH


def test_read_only_path_exits_3() -> None:
    """A directory the probe may not write to (as nobody when the tests run as root, who
    may write anywhere)."""
    as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]  # nobody
    with tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        os.chmod(scratch, 0o555)
        done = subprocess.run(
            [*(as_user if os.geteuid() == 0 else []), sys.executable, str(PROBE),
             "--path", scratch, *SMALL],
            check=False, capture_output=True, text=True, timeout=60,
        )
        assert not os.listdir(scratch)
    assert done.returncode == EXIT_PATH, done.stderr
    assert "not writable" in json.loads(done.stdout.splitlines()[0])["message"]


def test_a_failed_write_leaves_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufleet.suites.probes import storage

    chunk = storage._Content.chunk
    calls = []

    def full_disk(self: storage._Content, name: str, offset: int, size: int) -> bytearray:
        calls.append(name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return chunk(self, name, offset, size)

    monkeypatch.setattr(storage._Content, "chunk", full_disk)
    code, lines = probe(capsys, "--path", str(tmp_path), *SMALL)
    assert code == EXIT_PATH
    assert "No space left on device" in lines[0]["message"]
    assert list((tmp_path / TEST_DIR).iterdir()) == [tmp_path / TEST_DIR / "small"]


def test_prepare_writes_the_files_and_a_timed_start_reports_its_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    code, lines = probe(capsys, "--path", str(tmp_path), *SMALL, "--prepare")
    assert code == 0
    assert lines == [{"event": "prepared", "path": str(tmp_path.resolve()), "created_files": 52}]
    assert len(files(tmp_path / TEST_DIR)) == 52

    start_at = time.time() + 1.0
    code, lines = probe(capsys, "--path", str(tmp_path), *SMALL, "--start-at", str(start_at))
    assert code == 0
    [result] = lines
    assert result["created_files"] == 0
    assert result["late_s"] == 0.0
    assert start_at <= result["seq_start"] < result["seq_end"] < start_at + 30
    assert result["seq_read_mbps"] > 0

    past = time.time() - 5
    _, [late] = probe(capsys, "--path", str(tmp_path), *SMALL, "--start-at", str(past))
    assert late["late_s"] >= 5


def test_trials_read_every_kind_again_and_report_their_medians(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import statistics

    code, [result] = probe(capsys, "--path", str(tmp_path), *SMALL, "--trials", "3")
    assert code == 0
    assert result["trials"] == 3
    assert len(result["seq_trials"]) == 3 and len(result["small_trials"]) == 3
    assert result["seq_read_mbps"] == statistics.median(result["seq_trials"])
    assert result["small_files_per_s"] == statistics.median(result["small_trials"])
    assert result["bytes_read"] == 3 * 2 * 8 * 1024**2  # two readers' files, three times
