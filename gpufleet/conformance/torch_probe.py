"""Import torch on a node once per run (``catalog.TORCH_PROBE``: its version, CUDA, NCCL,
devices and arch list), for every check that needs what an imported torch reports.

Shared machinery: the stack and gpu suites both read it."""

from __future__ import annotations

import shlex
from typing import Any

from gpufleet.conformance.session import ConformanceSession, Node
from gpufleet.errors import ParseError
from gpufleet.facts.catalog import TORCH_PROBE
from gpufleet.facts.parsers import cuda
from gpufleet.roles import training_python

IMPORT_TIMEOUT_S = 300.0


def imported_torch(node: Node, conformance: ConformanceSession) -> dict[str, Any] | str:
    """What torch under the node's training python reports, or why it did not import."""
    python = training_python(node.host)

    def probe() -> dict[str, Any] | str:
        result = node.run(f"{shlex.quote(python)} -c {shlex.quote(TORCH_PROBE)}",
                          timeout=IMPORT_TIMEOUT_S)
        try:
            return cuda.torch_info(result.stdout if result.ok else result.stderr)
        except ParseError as exc:
            return f"importing torch under {python} failed: {exc}"

    return conformance.once(f"torch-probe {node.name}", probe)
