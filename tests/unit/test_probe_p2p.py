"""The P2P probe: ``trials_by_figure``, its command line and the skip without a GPU."""

from __future__ import annotations

import json

from gpufleet.suites.probes.p2p import trials_by_figure
from tests.probe_runs import needs_torch, run_without_gpu


def test_trials_by_figure_names_every_copy() -> None:
    lines = [
        {"event": "pair", "src": 0, "dst": 1, "gbps": 12.0, "trials": [11.0, 12.0, 13.0],
         "peer_access": False},
        {"event": "pair", "src": 1, "dst": 0, "gbps": 380.0, "peer_access": True},
        {"event": "h2d", "gpu": 0, "gbps": 50.0, "trials": [49.0, 50.0, 51.0]},
        {"event": "d2h", "gpu": 0, "gbps": 52.0, "trials": [52.0, 52.0, 53.0]},
        {"event": "summary", "gpus": 2, "devices": ["H200"] * 2},
    ]
    assert trials_by_figure(lines) == {
        "p2p.GPU0->GPU1": [11.0, 12.0, 13.0],
        "p2p.GPU1->GPU0": [380.0],  # a line from a probe without --trials: its one figure
        "h2d.GPU0": [49.0, 50.0, 51.0],
        "d2h.GPU0": [52.0, 52.0, 53.0],
    }
    assert trials_by_figure([]) == {}


@needs_torch
def test_without_a_gpu_it_skips() -> None:
    code = (
        "import os, sys, gpufleet.suites.probes.p2p as p; loaded = 'torch' in sys.modules; "
        "code = p.main([]); print(loaded, code, os.environ['NCCL_NVLS_ENABLE'])"
    )
    done = run_without_gpu(code)
    assert done.returncode == 0, done.stderr
    skip, last = done.stdout.splitlines()
    assert json.loads(skip) == {"event": "skip", "reason": "no CUDA GPU"}
    assert last == "False 0 0"

