"""Slurm's health check, prolog and epilog on every node: gpufleet-healthcheck and what it
expects.

Installs the standalone program (``gpufleet/node/healthcheck.py``, standard library only)
as ``/usr/local/sbin/gpufleet-healthcheck`` and its expectations as
``/etc/gpufleet/healthcheck.json``: the GPU count, the Xids the site makes critical (the
program judges every other Xid by NVIDIA's catalogue, which it carries), the local port range
the nccl_env role sets, where bootstrap records the node's versions, and the prolog's and
epilog's budgets, limits and state directory. With ``slurm_prolog`` / ``slurm_epilog`` it
also installs ``/usr/local/sbin/gpufleet-prolog`` / ``gpufleet-epilog``, two-line wrappers
that run the program in that context (Slurm's Prolog= and Epilog= take no arguments).
slurm.conf then names them as ``HealthCheckProgram``, ``Prolog`` and ``Epilog`` (see
docs/slurm.md); the slurm_node role declares the same four prolog/epilog variables, with
the same defaults, to check those lines.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from importlib import resources
from typing import ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.provision.managed import HEADER, file_change, render
from gpufleet.provision.plan import Change
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var
from gpufleet.roles import nccl_env, pytorch, slurm_node

# Where bootstrap records the node's versions (gpufleet.bootstrap.STATE_FILE); not imported,
# because bootstrap imports the role registry.
STATE_FILE = "/etc/gpufleet/node.json"
PROGRAM = resources.files("gpufleet.node").joinpath("healthcheck.py")
GANG_CHECK = resources.files("gpufleet.node").joinpath("gang_check.py")
WRAPPERS = {"prolog": ("slurm_prolog", "slurm_prolog_path"),
            "epilog": ("slurm_epilog", "slurm_epilog_path")}
_PORT = re.compile(r"^[A-Za-z0-9_.-]+/\d+\Z")
TIME_MAX_OFFSET_MS = 100
"""The clock's bound, the clock suite's and the health check's (docs/conformance.md#clock
says where it comes from): far inside munge's 300 s credential lifetime, and loose enough
for NTP over a data-centre network (1 ms on AWS's Time Sync Service)."""


def time_max_offset_ms(v: RoleVars) -> float | None:
    """The clock's bound for the health check: ``time_max_offset_ms`` (milliseconds above
    0), or None where ``time_check_offset`` is false (its synchronisation alone)."""
    bound = v.number("time_max_offset_ms")
    if not bound > 0:
        raise v.fail("time_max_offset_ms", "a number of milliseconds above 0",
                     v.get("time_max_offset_ms"))
    return bound if v.boolean("time_check_offset") else None


class SlurmHealthcheckRole(RoleBase):
    name = "slurm_healthcheck"
    order = 80
    variables: ClassVar[Mapping[str, Var]] = {
        "slurm_healthcheck": Var(False, "boolean", "install gpufleet-healthcheck"),
        "slurm_healthcheck_path": Var("/usr/local/sbin/gpufleet-healthcheck", "string",
                                      "where the program goes"),
        "slurm_healthcheck_config": Var("/etc/gpufleet/healthcheck.json", "string",
                                        "its expectations"),
        "slurm_healthcheck_python": Var("/usr/bin/python3", "string", "its interpreter"),
        "slurm_healthcheck_xids": Var([], "list", "Xids that drain whatever NVIDIA's catalogue "
                                                  "says"),
        "slurm_healthcheck_nvidia_smi_timeout_s": Var(4, "integer", "nvidia-smi deadline"),
        "slurm_healthcheck_budget_s": Var(9, "integer", "the whole program's deadline"),
        "slurm_prolog": Var(False, "boolean", "install gpufleet-prolog for Slurm's Prolog="),
        "slurm_prolog_path": Var("/usr/local/sbin/gpufleet-prolog", "string",
                                 "where the prolog wrapper goes"),
        "slurm_epilog": Var(False, "boolean", "install gpufleet-epilog for Slurm's Epilog="),
        "slurm_epilog_path": Var("/usr/local/sbin/gpufleet-epilog", "string",
                                 "where the epilog wrapper goes"),
        "slurm_prolog_budget_s": Var(5, "integer", "the prolog's deadline"),
        "slurm_epilog_budget_s": Var(30, "integer", "the epilog's deadline"),
        "slurm_epilog_kill_grace_s": Var(5, "integer", "seconds between the epilog's SIGTERM "
                                                       "and SIGKILL"),
        "slurm_epilog_max_used_mib": Var(1024, "integer", "the most memory (MiB) a job's GPU "
                                                          "may still use after it"),
        "slurm_job_memlock": slurm_node.ROLE.variables["slurm_job_memlock"],
        "slurm_fabric_ports": Var(None, "list", "InfiniBand/RoCE ports (mlx5_0/1) the prolog "
                                                "needs ACTIVE; unset: every port"),
        "slurm_healthcheck_state_dir": Var("/var/lib/gpufleet", "string",
                                           "the prolog's and epilog's state files"),
        "slurm_gang_check": Var(False, "boolean", "install gpufleet-gang-check, a multi-node "
                                                  "job's first step"),
        "slurm_gang_check_path": Var("/usr/local/sbin/gpufleet-gang-check", "string",
                                     "where it goes"),
        "pytorch_venv": pytorch.ROLE.variables["pytorch_venv"],
        "time_max_offset_ms": Var(TIME_MAX_OFFSET_MS, "number",
                                  "how far (ms) the clock may be from its time source"),
        "time_check_offset": Var(True, "boolean", "hold the clock's offset to "
                                                  "time_max_offset_ms (false: its "
                                                  "synchronisation alone)"),
        "gpu_count": Var(None, "integer", "GPUs the node must have"),
        "nccl_env": Var(None, "mapping", "the nccl_env role's settings: their local port "
                                         "range is the one the program expects"),
    }

    def active(self, v: RoleVars) -> bool:
        return v.boolean("slurm_healthcheck")

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if not self.active(v):
            return
        for key in ("slurm_healthcheck_path", "slurm_healthcheck_config",
                    "slurm_healthcheck_state_dir"):
            v.path(key)
        self.program(v)
        self.config(v)
        for context in WRAPPERS:
            self.wrapper(v, context)
        v.path("slurm_gang_check_path")
        self.gang_check(v)
        if v.get("nccl_env") is not None:
            nccl_env.ROLE.settings(RoleVars(v.host, nccl_env.ROLE.defaults))

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        keys = ["slurm_healthcheck_path", "slurm_healthcheck_config",
                *(path for flag, path in WRAPPERS.values() if v.boolean(flag)),
                *(["slurm_gang_check_path"] if v.boolean("slurm_gang_check") else [])]
        return {k: v.string(k) for k in keys}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(files=frozenset(self.managed_files(v).values()))

    def program(self, v: RoleVars) -> str:
        """The program as installed: its interpreter line and a managed-file note."""
        python = v.path("slurm_healthcheck_python", "the program's interpreter line")
        source = PROGRAM.read_text().split("\n", 1)[1]
        return f"#!{python}\n# {HEADER.format(role=self.name)}\n{source}"

    def gang_check(self, v: RoleVars) -> str:
        """gpufleet-gang-check as installed: run by the pytorch role's venv, which has torch."""
        python = v.path("pytorch_venv", "the gang check's interpreter") + "/bin/python"
        source = GANG_CHECK.read_text().split("\n", 1)[1]
        return f"#!{python}\n# {HEADER.format(role=self.name)}\n{source}"

    def wrapper(self, v: RoleVars, context: str) -> str:
        """gpufleet-prolog or gpufleet-epilog: the program in that context, with the role's
        configuration (Slurm runs Prolog= and Epilog= without arguments)."""
        flag, path = WRAPPERS[context]
        v.boolean(flag)
        v.path(path, f"Slurm's {context.capitalize()}=")
        program = shlex.quote(v.path("slurm_healthcheck_path"))
        config = shlex.quote(v.path("slurm_healthcheck_config"))
        return (f"#!/bin/sh\n# {HEADER.format(role=self.name)}\n"
                f"# Slurm's {context.capitalize()}=: gpufleet-healthcheck's {context} checks "
                "(docs/slurm.md)\n"
                f'exec {program} --config {config} --context {context} "$@"\n')

    def config(self, v: RoleVars) -> str:
        """healthcheck.json: the node's expectations, validated here rather than on the node."""
        count = None if v.get("gpu_count") is None else v.integer("gpu_count")
        if count is not None and count < 0:
            raise VarError(f"host {v.host.name}: variable gpu_count must be 0 or more, "
                           f"got {count}")
        xids = v.items("slurm_healthcheck_xids")
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in xids):
            raise VarError(f"host {v.host.name}: variable slurm_healthcheck_xids must be a "
                           f"list of Xid numbers, got {xids!r}")
        port_range = None
        if v.get("nccl_env") is not None:
            port_range = nccl_env.ROLE.port_range(RoleVars(v.host, nccl_env.ROLE.defaults))
        return render("gpufleet-healthcheck.json.j2", header=HEADER.format(role=self.name),
                      gpu_count=count, critical_xids=xids, port_range=port_range,
                      state_file=STATE_FILE,
                      nvidia_smi_timeout_s=self._seconds(v, "slurm_healthcheck_nvidia_smi_"
                                                            "timeout_s", 1),
                      budget_s=self._seconds(v, "slurm_healthcheck_budget_s", 4),
                      **self.job_settings(v))

    def job_settings(self, v: RoleVars) -> dict[str, object]:
        """The prolog's and epilog's keys of healthcheck.json, validated."""
        ports = v.get("slurm_fabric_ports")
        if ports is not None:
            ports = v.items("slurm_fabric_ports")
            if not all(isinstance(p, str) and _PORT.match(p) for p in ports):
                raise v.fail("slurm_fabric_ports", "a list of InfiniBand/RoCE ports as "
                             "device/port (mlx5_0/1)", v.get("slurm_fabric_ports"))
        return {
            "prolog_budget_s": self._bounded(v, "slurm_prolog_budget_s", 3, 60, "seconds"),
            "epilog_budget_s": self._bounded(v, "slurm_epilog_budget_s", 3, 300, "seconds"),
            "epilog_kill_grace_s": self._bounded(v, "slurm_epilog_kill_grace_s", 0, 60,
                                                 "seconds"),
            "epilog_max_used_mib": self._bounded(v, "slurm_epilog_max_used_mib", 0, None,
                                                 "MiB"),
            "job_memlock_min_kib": slurm_node.SlurmNodeRole.memlock_kib(v),
            "fabric_ports": ports,
            "state_dir": v.path("slurm_healthcheck_state_dir"),
            "time_max_offset_ms": time_max_offset_ms(v),
        }

    @staticmethod
    def _seconds(v: RoleVars, key: str, least: int) -> int:
        value = v.integer(key)
        if not least <= value <= 50:
            raise VarError(f"host {v.host.name}: variable {key} must be {least}-50 seconds "
                           f"(slurmd kills the program after 60), got {value}")
        return value

    @staticmethod
    def _bounded(v: RoleVars, key: str, least: int, most: int | None, unit: str) -> int:
        value = v.integer(key)
        if value < least or (most is not None and value > most):
            span = f"at least {least}" if most is None else f"{least}-{most}"
            raise VarError(f"host {v.host.name}: variable {key} must be {span} {unit}, "
                           f"got {value}")
        return value

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        files = [(v.string("slurm_healthcheck_path"), self.program(v), 0o755),
                 (v.string("slurm_healthcheck_config"), self.config(v), 0o644),
                 *((v.string(path), self.wrapper(v, context), 0o755)
                   for context, (flag, path) in WRAPPERS.items() if v.boolean(flag)),
                 *([(v.string("slurm_gang_check_path"), self.gang_check(v), 0o755)]
                   if v.boolean("slurm_gang_check") else [])]
        return [c for path, content, mode in files
                if (c := file_change(self.name, facts, path, content, mode=mode)) is not None]


ROLE = SlurmHealthcheckRole()
