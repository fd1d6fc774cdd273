"""The P2P probe: ``slow_pairs``, its command line and the skip without a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.probes.p2p import slow_pairs
from conformance.probes.probe_common import EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "conformance" / "probes" / "p2p.py"

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed"
)


def test_slow_pairs_names_each_pair_below_the_threshold() -> None:
    lines = [
        {"event": "pair", "src": 0, "dst": 1, "gbps": 12.34, "peer_access": False},
        {"event": "pair", "src": 1, "dst": 0, "gbps": 380.0, "peer_access": True},
        {"event": "pair", "src": 1, "dst": 2, "gbps": 299.96, "peer_access": True},
        {"event": "h2d", "gpu": 0, "gbps": 50.0},
        {"event": "summary", "gpus": 3, "devices": ["H200"] * 3},
    ]
    assert slow_pairs(lines, 300) == [
        "GPU0->GPU1 12.3 GB/s < 300 GB/s",
        "GPU1->GPU2 300.0 GB/s < 300 GB/s",
    ]
    assert slow_pairs(lines, 12.5) == ["GPU0->GPU1 12.3 GB/s < 12.5 GB/s"]
    assert slow_pairs(lines, 10) == []
    assert slow_pairs([], 300) == []
    assert slow_pairs([{"src": 2, "dst": 3, "gbps": 1.0}], 2) == ["GPU2->GPU3 1.0 GB/s < 2 GB/s"]


@needs_torch
def test_without_a_gpu_it_skips() -> None:
    code = (
        "import os, sys, conformance.probes.p2p as p; loaded = 'torch' in sys.modules; "
        "code = p.main([]); print(loaded, code, os.environ['NCCL_NVLS_ENABLE'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    skip, last = done.stdout.splitlines()
    assert json.loads(skip) == {"event": "skip", "reason": "no CUDA GPU"}
    assert last == "False 0 0"


@pytest.mark.parametrize("argv", [["--size-mb", "0"], ["--iters", "-1"], ["--iters", "x"]])
def test_bad_usage_exits_64(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, str(PROBE), *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == EXIT_USAGE
    assert "error:" in done.stderr
