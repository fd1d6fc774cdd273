"""The slurm_job suite's verdicts, pure: what a Slurm job step gets on a node (the job view
probe's document, ``conformance/probes/job_view.py``) against what the inventory declares
and what an SSH session on the node gets; the node's GPU GRES against its GPUs; and
Slurm's task, process tracking, device and limit propagation settings
(``scontrol show config``, as a flat mapping of its keys)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.conformance.checks.stack import settings as nccl_settings
from gpufleet.errors import ParseError
from gpufleet.facts.catalog import Fact

PROBE_MAX_BYTES = 256 * 1024
NO_DEV_FILES = "NoDevFiles"
_TOKEN = re.compile(r"[a-z0-9]+")
_NULL = frozenset({"", "(null)", "none", "n/a"})


@dataclass(frozen=True)
class Limit:
    """A resource limit's soft and hard values; None is unlimited."""

    soft: int | None
    hard: int | None


@dataclass(frozen=True)
class Device:
    """A GPU device file in the step and whether the step could open it (``ok``, else the
    errno's name)."""

    path: str
    open: str


@dataclass
class StepView:
    """What the probe reported; a field it did not report readably is None, with the reason
    in ``unreadable``."""

    memlock: Limit | None = None
    nofile: Limit | None = None
    shm_bytes: int | None = None
    gpu_env: dict[str, str] | None = None
    devices: list[Device] | None = None
    nccl_env: dict[str, str] | None = None
    nccl_conf: list[tuple[str, str | None]] | None = None
    unreadable: dict[str, str] = field(default_factory=dict)

    def why(self, name: str) -> str:
        """Why a field is None."""
        return self.unreadable.get(name, f"the probe reported no {name}")


# ---- the probe's document ----------------------------------------------------------------

def parse_view(text: str) -> StepView:
    """The probe's output -> a StepView. Output that holds no document of the probe (empty,
    too large, not JSON, another document) is a ParseError; a field that is missing or of
    the wrong shape is None in the view, with the reason."""
    size = len(text.encode("utf-8", "replace"))
    if size > PROBE_MAX_BYTES:
        raise ParseError(f"the job view probe printed {size} bytes, more than {PROBE_MAX_BYTES}")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ParseError("the job view probe printed nothing")
    line = next((line for line in reversed(lines) if line.startswith("{")), None)
    if line is None:
        raise ParseError(f"the job view probe printed no JSON document: {lines[-1][:120]!r}")
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise ParseError(f"the job view probe's output is not JSON ({exc}): "
                         f"{line[:120]!r}") from None
    if not isinstance(doc, dict) or doc.get("probe") != "job_view":
        raise ParseError(f"not the job view probe's document: {line[:120]!r}")
    view = StepView()
    limits = doc.get("limits")
    for name in ("memlock", "nofile"):
        try:
            setattr(view, name, _limit(limits.get(name) if isinstance(limits, dict) else None))
        except ValueError as exc:
            view.unreadable[name] = f"the probe's {name} limit {exc}"
    shm = doc.get("shm")
    if isinstance(shm, dict) and _count(shm.get("bytes")):
        view.shm_bytes = shm["bytes"]
    else:
        view.unreadable["shm"] = (f"/dev/shm could not be read in the step: {shm['error']}"
                                  if isinstance(shm, dict) and isinstance(shm.get("error"), str)
                                  else f"the probe's /dev/shm is {_shown(shm)}")
    view.gpu_env = _strings(doc.get("gpu_env"), "gpu_env", view)
    view.nccl_env = _strings(doc.get("nccl_env"), "nccl_env", view)
    view.devices = _devices(doc.get("devices"), view)
    view.nccl_conf = _conf(doc.get("nccl_conf"), view)
    return view


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shown(value: Any) -> str:
    return "missing" if value is None else f"{json.dumps(value)[:80]}"


def _limit(value: Any) -> Limit:
    if (not isinstance(value, list) or len(value) != 2
            or not all(_count(v) or v == "unlimited" for v in value)):
        raise ValueError(f"is {_shown(value)}: expected [soft, hard]")
    soft, hard = (None if v == "unlimited" else int(v) for v in value)
    return Limit(soft, hard)


def _strings(value: Any, name: str, view: StepView) -> dict[str, str] | None:
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                       for k, v in value.items()):
        return dict(value)
    view.unreadable[name] = f"the probe's {name} is {_shown(value)}: expected names and texts"
    return None


def _devices(value: Any, view: StepView) -> list[Device] | None:
    if isinstance(value, list) and all(
            isinstance(d, dict) and isinstance(d.get("path"), str)
            and isinstance(d.get("open"), str) for d in value):
        return [Device(d["path"], d["open"]) for d in value]
    view.unreadable["devices"] = f"the probe's devices are {_shown(value)}"
    return None


def _conf(value: Any, view: StepView) -> list[tuple[str, str | None]] | None:
    if isinstance(value, list) and all(
            isinstance(f, dict) and isinstance(f.get("path"), str)
            and isinstance(f.get("text", ""), str) for f in value):
        return [(f["path"], f.get("text")) for f in value]
    view.unreadable["nccl_conf"] = f"the probe's nccl_conf is {_shown(value)}"
    return None


# ---- an SSH session's limits (a fact) ---------------------------------------------------------

def parse_session_limits(text: str) -> dict[str, Limit]:
    """``memlock SOFT HARD`` (KiB, as ``ulimit -l`` says) and ``nofile SOFT HARD`` lines ->
    the limits in bytes and files."""
    found: dict[str, Limit] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) != 3 or words[0] not in ("memlock", "nofile"):
            continue
        scale = 1024 if words[0] == "memlock" else 1
        try:
            soft, hard = (None if w == "unlimited" else int(w) * scale for w in words[1:])
        except ValueError:
            raise ParseError(f"ulimit: expected numbers or 'unlimited', got {line!r}") from None
        found[words[0]] = Limit(soft, hard)
    if set(found) != {"memlock", "nofile"}:
        raise ParseError(f"ulimit: expected memlock and nofile lines, got {text[:80]!r}")
    return found


SESSION_LIMITS = Fact(
    "session_limits",
    "printf 'memlock %s %s\\nnofile %s %s\\n' \"$(ulimit -S -l)\" \"$(ulimit -H -l)\" "
    "\"$(ulimit -S -n)\" \"$(ulimit -H -n)\"",
    parse_session_limits)
"""The memlock and open-files limits of a session on the node (over SSH: what an SSH
session gets)."""


# ---- limits and /dev/shm ----------------------------------------------------------------------

def size(value: int | None) -> str:
    """Bytes for a person: ``64 KiB``, ``8 MiB``, ``1.5 GiB``, ``unlimited``."""
    if value is None:
        return "unlimited"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value} bytes"


def memlock_problem(job: Limit, min_kib: int | None, session: Limit | None) -> str | None:
    """Why the step's locked-memory limit is too small for NCCL over RDMA (None when it is
    unlimited, or at least ``min_kib`` KiB where the inventory declares a floor)."""
    if job.soft is None or (min_kib is not None and job.soft >= min_kib * 1024):
        return None
    ssh = f" (an SSH session gets {size(session.soft)})" if session is not None else ""
    floor = f", below slurm_job_memlock {min_kib} KiB" if min_kib is not None else ""
    return (f"a job step gets memlock {size(job.soft)}{ssh}{floor}: NCCL over "
            "InfiniBand/RoCE fails at init; set LimitMEMLOCK=infinity for slurmd and "
            "PropagateResourceLimitsExcept=MEMLOCK")


def nofile_problem(job: Limit, minimum: int, session: Limit | None) -> str | None:
    """Why the step's open-files limit is too small (None when its soft limit reaches
    ``minimum``)."""
    if job.soft is None or job.soft >= minimum:
        return None
    hard = "unlimited" if job.hard is None else str(job.hard)
    ssh = (f" (an SSH session gets {'unlimited' if session.soft is None else session.soft})"
           if session is not None else "")
    return (f"a job step gets nofile {job.soft} (hard {hard}){ssh}, below "
            f"slurm_job_nofile {minimum}: DataLoader workers and NCCL's connections fail "
            "with 'Too many open files'; raise LimitNOFILE for slurmd, and add NOFILE to "
            "PropagateResourceLimitsExcept where the submitting shells' limit is lower")


def shm_problem(job_bytes: int, min_gb: float, floor: str, node_bytes: int | None
                ) -> str | None:
    """Why the step's /dev/shm is too small (None when it holds ``min_gb`` GB); ``floor``
    names the variable that set ``min_gb``."""
    if job_bytes >= min_gb * 1e9:
        return None
    node = f" (the node's is {node_bytes / 1e9:.2f} GB)" if node_bytes is not None else ""
    return (f"a job step's /dev/shm is {job_bytes / 1e9:.2f} GB{node}, below {floor} "
            f"{min_gb:g}: NCCL's shared-memory transport and DataLoader workers run out of it")


# ---- the step's GPUs --------------------------------------------------------------------------

def _list(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def given_gpus(view: StepView, own_job: bool) -> list[str] | None:
    """The GPUs Slurm gave the step (``SLURM_STEP_GPUS``; ``SLURM_JOB_GPUS`` where the step
    is a job of its own), None where it says none."""
    env = view.gpu_env or {}
    found = env.get("SLURM_STEP_GPUS") or (env.get("SLURM_JOB_GPUS") if own_job else None)
    return _list(found)


def gpu_problems(view: StepView, asked: int, *, confine: bool, own_job: bool) -> list[str]:
    """What is wrong with the GPUs of a step that asked for ``asked`` of them: the GPUs
    Slurm gave it, ``CUDA_VISIBLE_DEVICES``, and the device files it can open (exactly its
    own where ``confine``)."""
    env = view.gpu_env or {}
    step = f"a step that asked for {asked} GPU{'s' if asked > 1 else ''} (--gres=gpu:{asked})"
    problems = []
    given = given_gpus(view, own_job)
    if not given:
        problems.append(f"{step} was given none by Slurm (no SLURM_STEP_GPUS)")
    elif len(given) != asked:
        problems.append(f"{step} was given {len(given)} (SLURM_STEP_GPUS={','.join(given)})")
    cvd_text = env.get("CUDA_VISIBLE_DEVICES")
    cvd = _list(cvd_text)
    if cvd is None:
        problems.append(f"{step} has no CUDA_VISIBLE_DEVICES: CUDA in it uses every GPU it "
                        "can open")
    elif cvd_text == NO_DEV_FILES:
        problems.append(f"{step} has CUDA_VISIBLE_DEVICES={NO_DEV_FILES}: gres.conf names no "
                        "device File for the node's GPUs")
    elif len(cvd) != asked:
        problems.append(f"{step} sees CUDA_VISIBLE_DEVICES={cvd_text} ({len(cvd)} GPUs)")
    devices = view.devices or []
    opened = [d.path for d in devices if d.open == "ok"]
    refused = ", ".join(f"{d.path}: {d.open}" for d in devices if d.open != "ok")
    if not devices:
        problems.append(f"{step} has no GPU device file (/dev/nvidia[0-9]*)")
        return problems
    reach = (f"can open {len(opened)} of the node's {len(devices)} GPU device files"
             f" ({', '.join(opened) or 'none'})")
    if len(opened) < asked:
        problems.append(f"{step} {reach}: the GPUs Slurm gave it are out of its reach"
                        + (f" ({refused})" if refused else ""))
    elif confine and len(opened) > asked:
        problems.append(f"{step} {reach}: device confinement is off (ConstrainDevices=yes in "
                        "cgroup.conf, with TaskPlugin task/cgroup), so its processes can use "
                        "GPUs Slurm gave other jobs")
    if cvd and len(cvd) == asked and all(v.isdigit() for v in cvd):
        problem = _numbering(cvd, given, confined=len(opened) < len(devices))
        if problem:
            problems.append(problem)
    return problems


def _numbering(cvd: list[str], given: list[str] | None, *, confined: bool) -> str | None:
    """Why ``CUDA_VISIBLE_DEVICES`` does not name what the step may use: in a step confined
    to its GPUs CUDA numbers them from 0 (Slurm sets them so under ConstrainDevices=yes);
    in one that is not, they must be the GPUs Slurm gave it."""
    shown = ",".join(cvd)
    if confined:
        local = [str(i) for i in range(len(cvd))]
        return None if cvd == local else (
            f"CUDA_VISIBLE_DEVICES={shown} in a step confined to its own GPUs, which CUDA "
            f"numbers from 0: CUDA finds no device there ({','.join(local)} expected)")
    if given and len(given) == len(cvd) and sorted(cvd) != sorted(given):
        return (f"CUDA_VISIBLE_DEVICES={shown} but Slurm gave the step GPU {','.join(given)} "
                "(SLURM_STEP_GPUS): its processes use GPUs of other jobs")
    return None


# ---- NCCL's environment -----------------------------------------------------------------------

def expected_env(nccl_env: Mapping[str, Any], gloo: str | None) -> dict[str, str]:
    """The environment the nccl_env role writes for launchers: its settings as it renders
    them (booleans lower-case), and ``GLOO_SOCKET_IFNAME`` (``gloo_socket_ifname``, else
    ``NCCL_SOCKET_IFNAME``)."""
    env = {str(k): str(v).lower() if isinstance(v, bool) else str(v)
           for k, v in nccl_env.items() if v is not None}
    interface = gloo or env.get("NCCL_SOCKET_IFNAME")
    if interface:
        env["GLOO_SOCKET_IFNAME"] = str(interface)
    return dict(sorted(env.items()))


def conf_settings(files: Sequence[tuple[str, str | None]]) -> dict[str, tuple[str, str]]:
    """What NCCL reads from its configuration files, each setting with the file it comes
    from: the first file that sets it wins (NCCL keeps what is already set)."""
    found: dict[str, tuple[str, str]] = {}
    for path, text in files:
        for key, value in nccl_settings(text or "").items():
            found.setdefault(key, (value, path))
    return found


def nccl_env_problems(expected: Mapping[str, str], job_env: Mapping[str, str],
                      conf: Mapping[str, tuple[str, str]], env_file: str) -> list[str]:
    """Each setting of ``expected`` a job step does not get: its environment wins, NCCL's
    own files come next (never for Gloo, which reads none)."""
    problems = []
    for key, want in expected.items():
        got = job_env.get(key)
        if got is not None:
            if got != want:
                problems.append(f"a job step gets {key}={got} from its environment, nccl_env "
                                f"sets {want} (the environment wins over nccl.conf)")
            continue
        if key.startswith("NCCL_") and key in conf:
            value, path = conf[key]
            if value != want:
                problems.append(f"a job step's NCCL reads {key}={value} from {path}, nccl_env "
                                f"sets {want}")
            continue
        why = ("no nccl.conf the step's NCCL reads sets it" if key.startswith("NCCL_")
               else "Gloo reads no nccl.conf")
        problems.append(f"a job step does not get {key}={want} ({why}; login shells get it "
                        f"from {env_file}): export it for every step, e.g. a TaskProlog "
                        f"printing 'export {key}={want}'")
    return problems


# ---- the node's GRES ----------------------------------------------------------------------

def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def names_model(gres_type: str, model: str) -> bool:
    """Whether a GRES type names a GPU model: each of its words is one of the model's
    (``h100``, ``nvidia_h100_80gb_hbm3`` for ``NVIDIA H100 80GB HBM3``), or its letters and
    digits run inside the model's (``h100nvl`` for ``NVIDIA H100 NVL``)."""
    words, model_words = _tokens(gres_type), _tokens(model)
    return bool(words) and (all(w in model_words for w in words)
                            or "".join(words) in "".join(model_words))


def gres_problems(node: str, gres: str, types: Sequence[tuple[str | None, int]], *,
                  gpus: int, where: str, models: Sequence[str], declared: str | None
                  ) -> list[str]:
    """What differs between the node's GPU GRES in Slurm and the GPUs the node has
    (``gpus``, found on ``where``; ``models``: their names): the count, and each type
    (``declared``, else one that names a model)."""
    total = sum(count for _, count in types)
    shown = gres or "(null)"
    problems = []
    if total != gpus:
        problems.append(f"Slurm's GRES for {node} is {shown} ({total} GPUs) but the node has "
                        f"{gpus} ({where}): "
                        + (f"jobs can be given only {total} of them" if total < gpus
                           else "Slurm would give jobs GPUs the node does not have"))
    for gres_type, _ in types:
        if declared is not None:
            if gres_type != declared:
                problems.append(f"Slurm's GRES for {node} ({shown}) names type "
                                f"{gres_type or 'none'}, slurm_job_gres_type is {declared}")
        elif gres_type is not None and models and not any(names_model(gres_type, m)
                                                          for m in models):
            problems.append(f"Slurm's GRES for {node} ({shown}) names type {gres_type} but "
                            f"the node's GPUs are {', '.join(sorted(set(models)))} (declare "
                            "slurm_job_gres_type where the type is a name of the site's own)")
    return problems


# ---- slurm.conf and cgroup.conf ------------------------------------------------------------

def _value(config: Mapping[str, str], key: str) -> str | None:
    value = config.get(key)
    return None if value is None or value.lower() in _NULL else value


def _names(value: str | None) -> set[str]:
    """The limits a propagation setting names (``NONE`` is a name; ``(null)`` names none)."""
    text = (value or "").strip()
    if text.lower() in ("", "(null)"):
        return set()
    return {v.strip().upper() for v in text.split(",") if v.strip()}


def memlock_propagated(config: Mapping[str, str]) -> bool:
    """Whether a job step gets the memlock limit of the process that submitted it:
    PropagateResourceLimits (ALL when Slurm prints none, its default) names it, or ALL, and
    PropagateResourceLimitsExcept does not."""
    named = _names(config.get("PropagateResourceLimits")) or {"ALL"}
    except_ = _names(config.get("PropagateResourceLimitsExcept"))
    return bool(named & {"ALL", "MEMLOCK"}) and not except_ & {"ALL", "MEMLOCK"}


def config_problems(config: Mapping[str, str], task_plugin: str, confine: bool) -> list[str]:
    """What in Slurm's configuration lets a job escape what it was given, or gives it the
    submitter's memlock limit: TaskPlugin without ``task_plugin`` (when not empty),
    ProctrackType other than proctrack/cgroup, ConstrainDevices not yes (when ``confine``),
    memlock propagated from the submitting shell."""
    problems = []
    plugins_text = _value(config, "TaskPlugin")
    plugins = {p if "/" in p else f"task/{p}" for p in
               (v.strip() for v in (plugins_text or "").split(",")) if p}
    if task_plugin and task_plugin not in plugins:
        problems.append(f"TaskPlugin is {plugins_text or '(null)'}, without {task_plugin}"
                        + (": a job's tasks are not confined to the CPUs, memory and devices "
                           "Slurm gave them" if task_plugin == "task/cgroup" else ""))
    proctrack = _value(config, "ProctrackType")
    if proctrack != "proctrack/cgroup":
        problems.append(f"ProctrackType is {proctrack or '(null)'}: Slurm tracks a job's "
                        "processes without cgroups, so a process that leaves its parent (a "
                        "daemonized worker, an orphaned launcher) outlives the job and keeps "
                        "its GPU memory; use proctrack/cgroup")
    if confine:
        devices = config.get("ConstrainDevices")
        if devices is None:
            problems.append("scontrol show config prints no cgroup.conf settings (no cgroup "
                            "plugin configured): a job's devices are not confined; set "
                            "ConstrainDevices=yes in cgroup.conf with TaskPlugin task/cgroup")
        elif devices.strip().lower() != "yes":
            problems.append(f"ConstrainDevices is {devices or '(null)'} in cgroup.conf: a job "
                            "can open every GPU of its node, those Slurm gave other jobs "
                            "included")
    if memlock_propagated(config):
        problems.append(
            f"PropagateResourceLimits is {config.get('PropagateResourceLimits') or '(null)'} "
            f"and PropagateResourceLimitsExcept "
            f"{config.get('PropagateResourceLimitsExcept') or '(null)'}: a job step gets the "
            "memlock limit of the shell that submitted it, not slurmd's (a login shell's "
            "64 KiB or 8 MiB breaks NCCL over InfiniBand/RoCE at init); set "
            "PropagateResourceLimitsExcept=MEMLOCK")
    return problems
