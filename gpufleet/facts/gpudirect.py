"""The route GPUDirect RDMA can take on a node, from its ``gpudirect`` fact
(``parsers.gpudirect``): shared by the peermem role, which chooses it, and the checks, which
name why a node has none."""

from __future__ import annotations

import re
from typing import Any

DMABUF_KERNEL = (5, 12)
_RELEASE = re.compile(r"^(\d+)\.(\d+)")


def _release(kernel: str) -> tuple[int, int]:
    """``6.8.0-90-generic`` -> ``(6, 8)`` (the fact's parser has checked the form)."""
    match = _RELEASE.match(kernel)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def dmabuf_route(state: dict[str, Any]) -> str | None:
    """Why the dma-buf route is unavailable on the node, or None when it is available: the
    open kernel module, a kernel of 5.12 or later, and ``CONFIG_DMA_SHARED_BUFFER`` where the
    kernel's config can be read."""
    if state["flavor"] != "open":
        return ("the NVIDIA kernel module is " + (state["flavor"] or "not loaded")
                + " (dma-buf needs the open kernel module)")
    if _release(state["kernel"]) < DMABUF_KERNEL:
        return f"kernel {state['kernel']} is older than 5.12 (dma-buf needs 5.12 or later)"
    if state["dma_buf"] is False:
        return f"kernel {state['kernel']} is built without CONFIG_DMA_SHARED_BUFFER"
    return None
