"""The slurm_job suite: what a Slurm job step gets on the node, beside what an SSH session
gets (in no set: it needs Slurm; ``--suite slurm_job`` or ``all`` runs it)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet import roles
from gpufleet.conformance.checks import host_sizing as host_sizing_checks
from gpufleet.conformance.checks import slurm_job as slurm_job_checks
from gpufleet.conformance.registry import Settings, Suite, declared, setting
from gpufleet.conformance.suites.host_sizing import HostSizingSettings
from gpufleet.facts.gather import FactRequest
from gpufleet.inventory.model import Host
from gpufleet.provision.role import RoleVars
from gpufleet.slurm.drain import slurm_of

MAX_STEP_GPUS = 64


@dataclass(frozen=True, kw_only=True)
class SlurmJobSettings(Settings):
    """What the slurm_job suite reads."""

    slurm_job_step_gpus: int | None = setting(
        None, "integer", "GPUs the probe's step asks for (default: 1 on a node with GPUs, "
                         "else 0; 0: no --gres)")
    slurm_job_memlock: int | str = declared(roles.job_limits()["slurm_job_memlock"])
    slurm_job_nofile: int = declared(roles.job_limits()["slurm_job_nofile"])
    slurm_job_min_shm_gb: float | None = setting(
        None, "number", "a job step's /dev/shm floor in GB (default: host_min_shm_gb)")
    host_min_shm_gb: float = declared(HostSizingSettings.variables()["host_min_shm_gb"])
    slurm_job_require_device_confinement: bool = setting(
        True, "boolean", "a step can open only the GPUs Slurm gave it (ConstrainDevices=yes)")
    slurm_job_task_plugin: str = setting(
        "task/cgroup", "string", "the task plugin TaskPlugin must include ('' for none)")
    slurm_job_gres_type: str | None = setting(
        None, "string", "the node's GPU GRES type (default: one that names the GPU model)")
    slurm_job_timeout_s: int = setting(
        120, "integer", "the probe's step: waiting for the node and running, in seconds")


def _check(v: RoleVars) -> None:
    slurm_of(v.host)
    gpus = v.get("slurm_job_step_gpus")
    if gpus is not None and not 0 <= v.integer("slurm_job_step_gpus") <= MAX_STEP_GPUS:
        raise v.fail("slurm_job_step_gpus", f"an integer from 0 to {MAX_STEP_GPUS}", gpus)
    if not 10 <= v.integer("slurm_job_timeout_s") <= 3600:
        raise v.fail("slurm_job_timeout_s", "an integer from 10 to 3600",
                     v.get("slurm_job_timeout_s"))
    roles.job_memlock_kib(v)
    if v.integer("slurm_job_nofile") < 1:
        raise v.fail("slurm_job_nofile", "an integer above 0", v.get("slurm_job_nofile"))
    if v.get("slurm_job_min_shm_gb") is not None and v.number("slurm_job_min_shm_gb") <= 0:
        raise v.fail("slurm_job_min_shm_gb", "a number above 0", v.get("slurm_job_min_shm_gb"))


def _facts(host: Host) -> FactRequest:
    return FactRequest(custom=frozenset({slurm_job_checks.SESSION_LIMITS,
                                         host_sizing_checks.SHM}))


SUITE = Suite(
    "slurm_job", (),
    "what a Slurm job step gets on the node: memlock and open-files limits, /dev/shm, "
    "its GPUs and NCCL's environment; the node's GPU GRES; Slurm's task, process tracking, "
    "device and limit propagation settings",
    order=148,
    settings=SlurmJobSettings,
    facts=_facts, check=_check)
