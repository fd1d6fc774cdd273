"""gpufleet tune on a provisioned lab node over gloo (two processes): the current setting and
the CPU-side knob (OMP_NUM_THREADS=2) measured in rounds, and a candidate whose runs fail (a
GLOO_SOCKET_IFNAME the nodes lack) shown failed and never the winner; a winner, where the
numbers call one, is a diff that git applies to the inventory."""

from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path

import pytest

from gpufleet import app
from tests.lab.test_provision import override

TUNE = {"tune_repeats": 2, "allreduce_sizes": "64K,1M", "allreduce_iters": 1, "ddp_steps": 6,
        "tune_candidates": {"OMP_NUM_THREADS": ["2"], "GLOO_SOCKET_IFNAME": ["nosuch0"]}}


# In the scale tier (./scripts/test -m scale): minutes of candidate rounds; CI's 30 minutes
# keep the unit tests of the rounds, the noise rule and the diff (tests/unit/test_tune.py).
@pytest.mark.scale
def test_tune_measures_every_candidate_and_calls_a_winner_only_beyond_the_noise(
        provisioned: Path, tmp_path: Path) -> None:
    out, patch = io.StringIO(), tmp_path / "tune.diff"
    names = ("current", "OMP_NUM_THREADS=2", "GLOO_SOCKET_IFNAME=nosuch0")
    with override(provisioned, "group_vars", "lab", TUNE):
        code = app.tune_cmd(str(provisioned), limit="node01", group="lab",
                            diff_path=str(patch), out=out)
        text = out.getvalue()
        won = any(line.startswith("winner: ") for line in text.splitlines())
        if won:
            applied = subprocess.run(["git", "apply", "--check", str(patch)], cwd=provisioned,
                                     check=False, capture_output=True, text=True)
            assert applied.returncode == 0, applied.stderr + patch.read_text()
    assert code == 0, text
    rows = {line.split()[0]: line for line in text.splitlines()
            if line.split() and line.split()[0] in names}
    assert set(rows) == set(names), text
    for name in names[:2]:
        assert re.search(r"\d[\d,.]* ±\d+\.\d%", rows[name]), rows[name]
    assert "failed: round 1: DDP:" in rows["GLOO_SOCKET_IFNAME=nosuch0"]
    if won:
        assert "\nwinner: OMP_NUM_THREADS=2 (+" in text
        assert "+  OMP_NUM_THREADS: '2'" in patch.read_text()
        assert "group_vars/lab.yml" in patch.read_text()
    else:
        assert "no winner: no candidate beats the current setting by more than the noise" \
            in text
        assert not patch.exists()
