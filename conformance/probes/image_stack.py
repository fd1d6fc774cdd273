"""Image stack probe: what a training image brings, seen from inside a container of it, in
one JSON line on stdout.

It runs with the image's own interpreter on the standard library (Python >= 3.9); torch is
imported when the image has it. It reports the image's CUDA declarations (CUDA_VERSION,
NVIDIA_REQUIRE_CUDA, NVIDIA_DISABLE_REQUIRE, NCCL_VERSION, as NVIDIA's images set them),
torch with its CUDA and NCCL, the NCCL package of the image's dpkg database, the GPUs the
container sees (``nvidia-smi -L`` and torch), the size of /dev/shm, the RDMA devices and
the container's mount table.

Exit status: 0 after the result.

    python3 image_stack.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

DECLARED = ("CUDA_VERSION", "NVIDIA_REQUIRE_CUDA", "NVIDIA_DISABLE_REQUIRE", "NCCL_VERSION",
            "NVIDIA_VISIBLE_DEVICES")
DPKG_STATUS = "/var/lib/dpkg/status"
NCCL_PACKAGES = ("libnccl2", "libnccl-dev")


def _torch() -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    found: dict[str, Any] = {"version": torch.__version__, "cuda": torch.version.cuda,
                             "cuda_available": False, "devices": 0, "nccl": None}
    try:
        found["cuda_available"] = bool(torch.cuda.is_available())
        found["devices"] = int(torch.cuda.device_count()) if found["cuda_available"] else 0
        if torch.version.cuda:
            found["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
    except Exception as exc:
        found["cuda_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return found


def _dpkg_nccl() -> str | None:
    """The version of the image's libnccl2 package, from its dpkg database."""
    try:
        with open(DPKG_STATUS, encoding="utf-8", errors="replace") as status:
            text = status.read()
    except OSError:
        return None
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, flags=re.MULTILINE))
        if fields.get("Package") in NCCL_PACKAGES and "installed" in fields.get("Status", ""):
            return fields.get("Version")
    return None


def _gpus() -> dict[str, Any]:
    """The GPUs ``nvidia-smi -L`` lists inside the container (None without nvidia-smi)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"nvidia_smi": None, "uuids": None}
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"nvidia_smi": smi, "uuids": None, "error": str(exc)[:300]}
    uuids = re.findall(r"\(UUID: ([^)]+)\)", done.stdout)
    return {"nvidia_smi": smi, "uuids": uuids,
            "error": None if done.returncode == 0 else done.stderr.strip()[:300]}


def _shm_bytes() -> int | None:
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def _rdma() -> list[str]:
    try:
        return sorted(os.listdir("/dev/infiniband"))
    except OSError:
        return []


def _mountinfo() -> str:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as table:
            return table.read()
    except OSError:
        return ""


def main() -> int:
    print(json.dumps({
        "event": "image_stack", "python": sys.version.split()[0],
        "env": {k: os.environ[k] for k in DECLARED if k in os.environ},
        "torch": _torch(), "dpkg_nccl": _dpkg_nccl(), "gpus": _gpus(),
        "shm_bytes": _shm_bytes(), "rdma_devices": _rdma(), "mountinfo": _mountinfo(),
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
