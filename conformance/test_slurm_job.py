"""slurm_job: what a Slurm job step gets on the node, which is not what an SSH session
gets: slurmd's limits (or the submitting shell's, where Slurm propagates them), the
/dev/shm of the job's namespace, only the GPUs Slurm gave it, and the environment Slurm
builds. One short step runs the job view probe on each node, from the controller with
Slurm's client: a job of its own, or a step of the run's allocation under ``--launcher
slurm``. The node's GPU GRES and Slurm's configuration are read with ``scontrol``.

A node without Slurm (no ``gpufleet_scheduler: slurm`` and no ``--launcher slurm``, or no
``scontrol``/``srun`` on the controller) skips every check, saying why; a node Slurm
starts no job on now (drained, down, busy) skips the checks of the step.

Variables: slurm_job_step_gpus (1 on a node with GPUs), slurm_job_memlock
(unlimited), slurm_job_nofile (131072), slurm_job_min_shm_gb (host_min_shm_gb, 1),
slurm_job_require_device_confinement (true), slurm_job_task_plugin (task/cgroup),
slurm_job_gres_type (a type naming the GPU model), slurm_job_timeout_s (120); the
nccl_env role's nccl_env and gloo_socket_ifname; gpufleet_scheduler, gpufleet_slurm_conf,
gpufleet_slurm_node.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet import roles
from gpufleet.conformance.checks import slurm_job as checks
from gpufleet.conformance.checks.host_sizing import SHM
from gpufleet.conformance.measure import slurm_job as measure
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.slurm_job import SlurmJobSettings
from gpufleet.slurm.client import SlurmNode
from gpufleet.slurm.config import SlurmConfig


def _where(node: Node, conformance: ConformanceSession) -> measure.JobSlurm:
    where = measure.job_slurm(node, conformance.options.launcher)
    if isinstance(where, str):
        pytest.skip(where)
    return where


def _slurm_node(node: Node, conformance: ConformanceSession,
                where: measure.JobSlurm) -> SlurmNode:
    read = conformance.once(f"slurm_job:node:{node.name}", lambda: measure.read_node(where))
    if read.node is None:
        pytest.fail(f"unknown: {read.error}")
    return read.node


def _gpus(node: Node) -> tuple[int, str, list[str]] | None:
    """The node's GPUs as its facts say: how many, from where, their models."""
    facts = node.known
    gpus: list[dict[str, Any]] | None = facts.get("gpus")
    if gpus is not None:
        return len(gpus), "nvidia-smi", [str(g["name"]) for g in gpus if g.get("name")]
    pci = facts.get("pci_gpus")
    return (len(pci), "the PCI bus", []) if pci is not None else None


def _asked(node: Node) -> int:
    """The GPUs the probe's step asks for: slurm_job_step_gpus, else one where the node
    has any."""
    declared = node.typed(SlurmJobSettings).slurm_job_step_gpus
    if declared is not None:
        return declared
    found = _gpus(node)
    return 1 if found and found[0] else 0


def _view(node: Node, conformance: ConformanceSession) -> checks.StepView:
    """What the node's job step reported (the step runs once per node for every check)."""
    where = _where(node, conformance)
    slurm_node = _slurm_node(node, conformance, where) if where.own_job else None
    settings = node.typed(SlurmJobSettings)

    def run() -> measure.JobView:
        found = measure.job_view(node, where, slurm_node, gpus=_asked(node),
                                 timeout_s=settings.slurm_job_timeout_s,
                                 partition=conformance.options.partition)
        conformance.add_report("slurm_job", node.name, {
            "command": found.command, "duration_s": round(found.duration_s, 3),
            "skip": found.skip, "error": found.error})
        return found

    found = conformance.once(f"slurm_job:view:{node.name}", run)
    if found.skip is not None:
        pytest.skip(found.skip)
    if found.view is None:
        pytest.fail(f"unknown: {found.error}")
    return found.view


def _session(node: Node, conformance: ConformanceSession, name: str) -> checks.Limit | None:
    """An SSH session's limit on the node (None under the Slurm launcher, whose sessions
    are job steps themselves, over a local connection, or where it could not be read)."""
    if conformance.options.launcher != "ssh" or node.host.connection != "ssh":
        return None
    limits: dict[str, checks.Limit] | None = node.known.get(checks.SESSION_LIMITS.name)
    return limits.get(name) if limits else None


def test_job_memlock(node: Node, conformance: ConformanceSession,
                     record_property: RecordProperty) -> None:
    view = _view(node, conformance)
    if view.memlock is None:
        pytest.fail(f"unknown: {view.why('memlock')}")
    record_property("memlock_bytes", [view.memlock.soft, view.memlock.hard])
    memlock = node.typed(SlurmJobSettings).slurm_job_memlock
    problem = checks.memlock_problem(view.memlock,
                                     None if memlock == "unlimited" else int(memlock),
                                     _session(node, conformance, "memlock"))
    assert problem is None, problem


def test_job_nofile(node: Node, conformance: ConformanceSession,
                    record_property: RecordProperty) -> None:
    view = _view(node, conformance)
    if view.nofile is None:
        pytest.fail(f"unknown: {view.why('nofile')}")
    record_property("nofile", [view.nofile.soft, view.nofile.hard])
    problem = checks.nofile_problem(view.nofile,
                                    node.typed(SlurmJobSettings).slurm_job_nofile,
                                    _session(node, conformance, "nofile"))
    assert problem is None, problem


def test_job_shm(node: Node, conformance: ConformanceSession,
                 record_property: RecordProperty) -> None:
    view = _view(node, conformance)
    if view.shm_bytes is None:
        pytest.fail(f"unknown: {view.why('shm')}")
    settings = node.typed(SlurmJobSettings)
    floor, minimum = (("slurm_job_min_shm_gb", settings.slurm_job_min_shm_gb)
                      if settings.slurm_job_min_shm_gb is not None
                      else ("host_min_shm_gb", settings.host_min_shm_gb))
    record_property("shm_gb", round(view.shm_bytes / 1e9, 2))
    problem = checks.shm_problem(view.shm_bytes, minimum, floor, node.known.get(SHM.name))
    assert problem is None, problem


def test_job_gpus(node: Node, conformance: ConformanceSession,
                  record_property: RecordProperty) -> None:
    asked = _asked(node)
    if asked == 0:
        found = _gpus(node)
        if found is None:
            pytest.fail(f"unknown: the node's GPUs: {node.known.why_absent('gpus')}")
        pytest.skip("slurm_job_step_gpus is 0: the step asks for no GPU" if found[0]
                    else f"no GPU on the node ({found[1]})")
    view = _view(node, conformance)
    for name in ("gpu_env", "devices"):
        if getattr(view, name) is None:
            pytest.fail(f"unknown: {view.why(name)}")
    where = _where(node, conformance)
    record_property("asked", asked)
    record_property("gpu_env", view.gpu_env)
    record_property("devices", {d.path: d.open for d in view.devices or []})
    problems = checks.gpu_problems(
        view, asked, own_job=where.own_job,
        confine=node.typed(SlurmJobSettings).slurm_job_require_device_confinement)
    assert not problems, "; ".join(problems)


def test_job_nccl_env(node: Node, conformance: ConformanceSession,
                      record_property: RecordProperty) -> None:
    declared = node.var("nccl_env")
    if not declared:
        pytest.skip("the inventory sets no nccl_env")
    view = _view(node, conformance)
    if view.nccl_env is None:
        pytest.fail(f"unknown: {view.why('nccl_env')}")
    if view.nccl_conf is None:
        pytest.fail(f"unknown: {view.why('nccl_conf')}")
    expected = checks.expected_env(declared, node.var("gloo_socket_ifname"))
    conf = checks.conf_settings(view.nccl_conf)
    record_property("job_env", view.nccl_env)
    record_property("nccl_conf", {k: f"{v} ({path})" for k, (v, path) in conf.items()})
    problems = checks.nccl_env_problems(
        expected, view.nccl_env, conf,
        roles.provided(node.host, "nccl_env_file", "/etc/default/gpufleet-nccl"))
    assert not problems, "; ".join(problems)


def test_slurm_gres(node: Node, conformance: ConformanceSession,
                    record_property: RecordProperty) -> None:
    where = _where(node, conformance)
    slurm_node = _slurm_node(node, conformance, where)
    found = _gpus(node)
    if found is None:
        pytest.fail(f"unknown: the node's GPUs: {node.known.why_absent('gpus')}")
    gpus, source, models = found
    record_property("gres", slurm_node.gres)
    if gpus == 0 and slurm_node.gpus == 0:
        pytest.skip(f"no GPU on the node ({source}) and none in Slurm's GRES")
    problems = checks.gres_problems(
        where.node, slurm_node.gres, slurm_node.gpu_types, gpus=gpus, where=source,
        models=models, declared=node.typed(SlurmJobSettings).slurm_job_gres_type)
    assert not problems, "; ".join(problems)


def test_slurm_config(node: Node, conformance: ConformanceSession,
                      record_property: RecordProperty) -> None:
    where = _where(node, conformance)
    read = conformance.once(f"slurm_job:config:{where.slurm.conf}",
                            lambda: measure.read_config(where.slurm))
    config: SlurmConfig | None = read.config
    if config is None:
        pytest.fail(f"unknown: {read.error}")
    flat = config.flat()
    record_property("slurm_version", config.version)
    record_property("settings", {k: flat.get(k) for k in (
        "TaskPlugin", "ProctrackType", "ConstrainDevices", "PropagateResourceLimits",
        "PropagateResourceLimitsExcept")})
    settings = node.typed(SlurmJobSettings)
    problems = checks.config_problems(flat, settings.slurm_job_task_plugin,
                                      settings.slurm_job_require_device_confinement)
    assert not problems, "; ".join(problems)
