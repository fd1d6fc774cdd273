"""Running the probes as a node runs them: subprocesses with a clean torchrun environment,
their JSON-line output parsed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

PROBES = ROOT / "conformance" / "probes"
TORCHRUN = Path(sys.executable).with_name("torchrun")
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed"
)


def probe_env() -> dict[str, str]:
    """This environment without torchrun's variables, with gloo on loopback."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"}
    }
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    return env


def run_probe(command: list[str], timeout: float = 120) -> tuple[int, list[dict[str, Any]]]:
    """Run a probe command; its exit code and every stdout line, each of which must be JSON."""
    done = subprocess.run(command, check=False, cwd=ROOT, env=probe_env(),
                          capture_output=True, text=True, timeout=timeout)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return done.returncode, lines


def events(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["event"] == kind]


def check_phases(lines: list[dict[str, Any]], world: int, phases: list[str]) -> None:
    """Every rank reported every phase, in order, from its own host and local rank."""
    for rank in range(world):
        mine = [line for line in events(lines, "phase") if line["rank"] == rank]
        assert [line["phase"] for line in mine] == phases
        assert [line["t"] for line in mine] == sorted(line["t"] for line in mine)
        assert all(line["host"] and line["local_rank"] == rank for line in mine)


def run_without_gpu(code: str) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` from the project root with every GPU hidden."""
    return subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=60)
