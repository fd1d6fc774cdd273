"""The ``gpudirect`` fact: what GPUDirect RDMA needs on a node, read in one snippet of cheap
file reads (``catalog.gpudirect_fact``); the route it can take is ``facts.gpudirect``'s.

GPUDirect RDMA lets an RDMA NIC read and write GPU memory. NCCL reaches it by one of two
routes (NVIDIA's GPUDirect RDMA guide, NCCL's environment documentation):

- **dma-buf**: the Linux kernel's own buffer sharing, with NVIDIA's open kernel module
  (``Dual MIT/GPL``), a kernel of 5.12 or later built with ``CONFIG_DMA_SHARED_BUFFER``, and
  CUDA 11.7 or later; NVIDIA recommends it where it is available, with no extra module;
- **nvidia-peermem**: the peer-memory module of the driver, loaded into the kernel
  (``/sys/module/nvidia_peermem``); the only route of the proprietary module.

The snippet prints ``key value`` lines: ``kernel`` (the release), ``peermem_loaded`` and
``nvidia_loaded`` (``yes``/``no``), ``peermem_file`` (the module's path in modules.dep, empty
when the running kernel has none), ``module`` (the first line of
``/proc/driver/nvidia/version``), ``taint`` (``/sys/module/nvidia/taint``: ``P`` for a
proprietary module), ``rdma`` (the RDMA devices in ``/sys/class/infiniband``, comma
separated), ``dma_buf`` (the ``CONFIG_DMA_SHARED_BUFFER`` line of the kernel's
config, empty where ``/boot/config-*`` is missing) and one ``nccl_conf`` line per GPUDirect
setting in ``/etc/nccl.conf``.
"""

from __future__ import annotations

import re
from typing import Any

from gpufleet.facts.parsers._capture import _error

MAX_CHARS = 64 * 1024
KEYS = ("kernel", "peermem_loaded", "nvidia_loaded", "peermem_file", "module", "taint",
        "rdma", "dma_buf")
MAX_LOG_CHARS = 4000 * 401
GDR_SETTINGS = ("NCCL_NET_GDR_LEVEL", "NCCL_IB_GDR_LEVEL", "NCCL_NET_GDR_READ",
                "NCCL_DMABUF_ENABLE")
_RELEASE = re.compile(r"^\d+\.\d+")
_SETTING = re.compile(r"^\s*([A-Z_]+)\s*=\s*(.*?)\s*$")


def gpudirect_state(text: str) -> dict[str, Any]:
    """The fact from the snippet's output: ``kernel``, ``peermem_loaded``,
    ``nvidia_loaded``, ``peermem_file`` (None without one), ``flavor`` (``open``,
    ``proprietary``, None where no module is loaded), ``rdma`` (the RDMA devices),
    ``dma_buf`` (True, False, None: the kernel's config is not readable) and ``nccl_conf``
    (setting -> value)."""
    if len(text) > MAX_CHARS:
        raise _error("the gpudirect snippet", f"at most {MAX_CHARS} characters",
                     text[:80])
    seen: dict[str, str] = {}
    conf: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "nccl_conf":
            match = _SETTING.match(value)
            if match is None:  # the snippet's grep keeps SETTING=VALUE lines only
                raise _error("the gpudirect snippet", "nccl_conf SETTING=VALUE", line)
            conf[match.group(1)] = match.group(2).strip("\"'")
        elif key in KEYS:
            seen[key] = value.strip()
    missing = [k for k in KEYS if k not in seen]
    if missing or not _RELEASE.match(seen["kernel"]):
        raise _error("the gpudirect snippet", "kernel, peermem_loaded, nvidia_loaded, "
                     "peermem_file, module, taint, rdma and dma_buf lines", text)
    return {"kernel": seen["kernel"], "peermem_loaded": seen["peermem_loaded"] == "yes",
            "nvidia_loaded": seen["nvidia_loaded"] == "yes",
            "peermem_file": seen["peermem_file"] or None,
            "flavor": _flavor(seen["module"], seen["taint"], seen["nvidia_loaded"] == "yes"),
            "rdma": [d for d in seen["rdma"].split(",") if d],
            "dma_buf": _dma_buf(seen["dma_buf"]), "nccl_conf": conf}


def log_lines(text: str) -> str:
    """The GPUDirect lines of an NCCL log as the snippet kept them (at most
    ``MAX_LOG_CHARS``)."""
    if len(text) > MAX_LOG_CHARS:
        raise _error("the NCCL log's GPUDirect lines", f"at most {MAX_LOG_CHARS} characters",
                     text[:80])
    return text


def _flavor(module: str, taint: str, loaded: bool) -> str | None:
    """``open`` or ``proprietary`` from the module's version line, else its taint flags (a
    proprietary module taints the kernel ``P``); None without a loaded module."""
    if "Open Kernel Module" in module:
        return "open"
    if "Kernel Module" in module:
        return "proprietary"
    if not loaded:
        return None
    return "proprietary" if "P" in taint else "open"


def _dma_buf(line: str) -> bool | None:
    """``CONFIG_DMA_SHARED_BUFFER=y`` -> True, ``# ... is not set`` -> False, nothing ->
    None (no readable config)."""
    if not line:
        return None
    return line.startswith("CONFIG_DMA_SHARED_BUFFER=") and not line.endswith("=n")
