"""gpu_state: what stays set on a GPU between jobs, against the declared state, read from
the ``gpus`` fact (``nvidia-smi --query-gpu``) gathered with the others.

Per GPU: MIG mode off (gpu_state_mig), ECC on where the GPU has ECC (gpu_state_ecc),
persistence mode on (gpu_persistence_mode), the power limit at the GPU's own default
(gpu_state_power_limit_w: declared watts), application clocks at their defaults
(gpu_state_app_clocks: 'memory,graphics' MHz), no clocks locked by nvidia-smi -lgc/-lmc
(gpu_state_locked_clocks), compute mode Default (gpu_state_compute_mode). A setting the
driver does not report is unknown, never a pass. The gpu_settings role reports the same
differences in drift and sets the ones ``gpu_state_manage`` names.
"""

from __future__ import annotations

import pytest

from gpufleet.conformance.checks.gpu_state import declared, problems, state
from gpufleet.conformance.session import Node, RecordProperty
from gpufleet.conformance.suites.gpu_state import GpuStateSettings


def test_gpu_state(node: Node, record_property: RecordProperty) -> None:
    facts = node.known
    gpus: list[dict[str, object]] | None = facts.get("gpus")
    if gpus is None:
        reason = facts.why_absent("gpus")
        if "not found" in reason or not facts.get("pci_gpus"):
            pytest.skip(f"no NVIDIA GPU: {reason}")
        record_property("finding_class", "configuration")
        pytest.fail(f"unknown: NVIDIA GPUs on the PCI bus but nvidia-smi failed: {reason}")
    if not gpus:
        pytest.skip("no NVIDIA GPU: nvidia-smi lists none")
    s = node.typed(GpuStateSettings)
    want = declared(mig=s.gpu_state_mig, ecc=s.gpu_state_ecc,
                    persistence=s.gpu_persistence_mode,
                    power_limit_w=s.gpu_state_power_limit_w,
                    app_clocks=s.gpu_state_app_clocks, locked_clocks=s.gpu_state_locked_clocks,
                    compute_mode=s.gpu_state_compute_mode)
    record_property("gpu_state", state(gpus))
    differ, unknown = problems(gpus, want)
    if differ or unknown:
        record_property("finding_class", "configuration")
    assert not differ, "; ".join(differ + unknown)
    if unknown:
        pytest.fail("unknown: " + "; ".join(unknown))
