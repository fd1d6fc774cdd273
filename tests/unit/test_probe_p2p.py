"""The P2P probe: ``slow_pairs``, its command line and the skip without a GPU."""

from __future__ import annotations

import json

from conformance.probes.p2p import slow_pairs
from tests.probe_runs import needs_torch, run_without_gpu


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
    done = run_without_gpu(code)
    assert done.returncode == 0, done.stderr
    skip, last = done.stdout.splitlines()
    assert json.loads(skip) == {"event": "skip", "reason": "no CUDA GPU"}
    assert last == "False 0 0"

