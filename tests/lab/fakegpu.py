"""A stand-in nvidia-smi on lab nodes that replays real output captured on a 2x H200 node
(tests/fixtures/h200x2), so GPU facts and checks run on GPU-less lab nodes. A node can be
made to hang (as nvidia-smi does on a GPU that fell off the bus), to list fewer GPUs in
its query than its topology shows, to have its last GPU of another model, or to report a
driver of another CUDA version. ``nvidia-smi -L`` is derived from the query capture (the
same GPUs, in -L's format)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager

from gpufleet.facts.parsers import nvidia_smi
from gpufleet.lab.cluster import Lab
from tests.conftest import ROOT
from tests.lab.conftest import node_sh

CAPTURES = ROOT / "tests" / "fixtures" / "h200x2"
REPLAYED = {"query": "query_gpu_csv.txt", "topo": "topo_m.txt", "nvlink": "nvlink_status.txt",
            "q": "nvidia_smi_q.txt"}
STATE = "/etc/gpufleet-lab/fake-gpu"
SCRIPT = f"""#!/bin/sh
# gpufleet lab stand-in for nvidia-smi: replays output captured on a real 2x H200 node.
d={STATE}
[ -e "$d/hang" ] && exec sleep 3600
case "$*" in
  *--query-gpu=*) cat "$d/query" ;;
  "topo -m") cat "$d/topo" ;;
  "nvlink --status") cat "$d/nvlink" ;;
  "-q") cat "$d/q" ;;
  "-L") cat "$d/list" ;;
  *) echo "lab nvidia-smi: arguments not replayed: $*" >&2; exit 2 ;;
esac
"""


def install(lab: Lab, node: str, *, hang: bool = False, drop_last_gpu: bool = False,
            last_gpu_model: str | None = None, driver_cuda: str | None = None) -> None:
    """Put the stand-in on ``node`` (its /usr/local/bin, in the node's own overlay)."""
    commands = [f"mkdir -p {STATE}",
                f"printf '%s' {shlex.quote(SCRIPT)} > /usr/local/bin/nvidia-smi",
                "chmod 755 /usr/local/bin/nvidia-smi"]
    for name, capture in REPLAYED.items():
        text = (CAPTURES / capture).read_text()
        if name == "query" and drop_last_gpu:
            text = "".join(text.splitlines(keepends=True)[:-1])
        if name == "query" and last_gpu_model:
            *rest, last = text.splitlines(keepends=True)
            text = "".join([*rest, last.replace("NVIDIA H200", last_gpu_model, 1)])
        if name == "q" and driver_cuda:
            text = re.sub(r"^(CUDA Version\s*:) \S+", rf"\1 {driver_cuda}", text, count=1,
                          flags=re.MULTILINE)
        commands.append(f"printf '%s' {shlex.quote(text)} > {STATE}/{name}")
    listing = "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n"
                      for g in nvidia_smi.nvidia_smi_query((CAPTURES / REPLAYED["query"])
                                                        .read_text()))
    commands.append(f"printf '%s' {shlex.quote(listing)} > {STATE}/list")
    if hang:
        commands.append(f": > {STATE}/hang")
    node_sh(lab, node, " && ".join(commands))


def remove(lab: Lab, node: str) -> None:
    node_sh(lab, node, f"rm -rf {STATE} /usr/local/bin/nvidia-smi")


@contextmanager
def fake_gpus(lab: Lab, nodes: list[str], hang: frozenset[str] = frozenset()
              ) -> Iterator[None]:
    """The stand-in on every node of ``nodes`` (hanging on those in ``hang``), removed
    afterwards."""
    try:
        for node in nodes:
            install(lab, node, hang=node in hang)
        yield
    finally:
        for node in nodes:
            remove(lab, node)
