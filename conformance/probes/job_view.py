"""Job view probe: what a Slurm job step gets on its node, as one JSON document on stdout.

The controller runs it as a job step (``srun ... python3 -c <this file>``): it is never
copied to a node and needs only Python >= 3.9 and its standard library. It reports the
step's resource limits (memlock and open files, soft and hard, ``"unlimited"`` for
RLIM_INFINITY), the size of its /dev/shm, the GPU variables Slurm set for it
(``CUDA_VISIBLE_DEVICES``, ``SLURM_STEP_GPUS``, ``SLURM_JOB_GPUS``), which GPU device files
(``/dev/nvidia0`` ...) it can open (``ok``, else the errno's name: ``EPERM`` where the
device cgroup denies it), the NCCL and Gloo variables of its environment, and the
configuration files NCCL itself would read in it (``NCCL_CONF_FILE`` or ``~/.nccl.conf``,
then ``/etc/nccl.conf``). Every list and text is capped, so its output stays small.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import resource
import sys

VERSION = 1
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_JOB_ID",
                 "SLURM_STEP_ID", "SLURMD_NODENAME")
MAX_DEVICES = 64
MAX_VARIABLES = 256
MAX_VALUE = 4096
MAX_CONF_BYTES = 16384


def limit(which: int) -> list[object]:
    """A resource limit's soft and hard values."""
    return [("unlimited" if value == resource.RLIM_INFINITY else value)
            for value in resource.getrlimit(which)]


def shm() -> dict[str, object]:
    """The size of /dev/shm, or why it cannot be read."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError as exc:
        return {"error": f"{exc.strerror or exc}"}
    return {"bytes": stat.f_frsize * stat.f_blocks}


def _minor(path: str) -> int:
    digits = path[len("/dev/nvidia"):]
    return int(digits) if digits.isdigit() else 1 << 30


def devices() -> list[dict[str, str]]:
    """Each GPU device file and whether this process may open it."""
    found = []
    for path in sorted(glob.glob("/dev/nvidia[0-9]*"), key=_minor)[:MAX_DEVICES]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            state = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        else:
            os.close(fd)
            state = "ok"
        found.append({"path": path, "open": state})
    return found


def nccl_conf_files() -> list[dict[str, object]]:
    """The files NCCL reads its settings from, in its order (the first wins)."""
    chosen = os.environ.get("NCCL_CONF_FILE") or os.path.join(os.path.expanduser("~"),
                                                               ".nccl.conf")
    files = []
    for path in (chosen, "/etc/nccl.conf"):
        entry: dict[str, object] = {"path": path}
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_CONF_BYTES + 1)
        except OSError as exc:
            entry["error"] = errno.errorcode.get(exc.errno or 0, str(exc))
        else:
            entry["text"] = data[:MAX_CONF_BYTES].decode("utf-8", "replace")
            entry["truncated"] = len(data) > MAX_CONF_BYTES
        files.append(entry)
    return files


def main() -> int:
    environ = {k: v[:MAX_VALUE] for k, v in os.environ.items()}
    nccl = sorted(k for k in environ if k.startswith("NCCL_") or k == "GLOO_SOCKET_IFNAME")
    document = {
        "probe": "job_view",
        "version": VERSION,
        "limits": {"memlock": limit(resource.RLIMIT_MEMLOCK),
                   "nofile": limit(resource.RLIMIT_NOFILE)},
        "shm": shm(),
        "gpu_env": {k: environ[k] for k in GPU_VARIABLES if k in environ},
        "devices": devices(),
        "nccl_env": {k: environ[k] for k in nccl[:MAX_VARIABLES]},
        "nccl_conf": nccl_conf_files(),
    }
    sys.stdout.write(json.dumps(document, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
