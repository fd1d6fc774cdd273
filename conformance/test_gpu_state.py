"""The GPUs' standing state: what stays set on a GPU between jobs (its ECC mode), read
from the ``gpus`` fact (``nvidia-smi --query-gpu``) gathered with the others."""

from __future__ import annotations

import pytest

from gpufleet.conformance.checks.gpu_state import ecc_modes, ecc_problems
from gpufleet.conformance.session import Node, RecordProperty
from gpufleet.conformance.suites.gpu_state import GpuStateSettings


def test_ecc_mode(node: Node, record_property: RecordProperty) -> None:
    if not node.typed(GpuStateSettings).gpu_state_ecc:
        pytest.skip("gpu_state_ecc is false")
    facts = node.known
    gpus: list[dict[str, object]] | None = facts.get("gpus")
    if gpus is None:
        reason = facts.why_absent("gpus")
        if "not found" in reason or not facts.get("pci_gpus"):
            pytest.skip(f"no NVIDIA GPU: {reason}")
        pytest.fail(f"unknown: NVIDIA GPUs on the PCI bus but nvidia-smi failed: {reason}")
    if not gpus:
        pytest.skip("no NVIDIA GPU: nvidia-smi lists none")
    modes = ecc_modes(gpus)
    record_property("ecc_mode", modes)
    if all(mode is None for mode in modes.values()):
        pytest.skip("no GPU reports an ECC mode (GPUs without ECC)")
    off, unknown = ecc_problems(modes)
    assert not off, "; ".join(off + unknown)
    if unknown:
        pytest.fail("unknown: " + "; ".join(unknown))
