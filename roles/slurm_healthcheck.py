"""Slurm's health check program on every node: gpufleet-healthcheck and what it expects.

Installs the standalone program (``gpufleet/healthcheck/program.py``, standard library only)
as ``/usr/local/sbin/gpufleet-healthcheck`` and its expectations as
``/etc/gpufleet/healthcheck.json``: the GPU count, the critical Xids, the local port range
the nccl_env role sets, and where bootstrap records the node's versions. slurm.conf then
names it as ``HealthCheckProgram`` (see docs/slurm.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from typing import ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.xids import CRITICAL_XIDS
from gpufleet.provision.managed import HEADER, file_change, render
from gpufleet.provision.plan import Change
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var
from gpufleet.roles import nccl_env

# Where bootstrap records the node's versions (gpufleet.bootstrap.STATE_FILE); not imported,
# because bootstrap imports the role registry.
STATE_FILE = "/etc/gpufleet/node.json"
PROGRAM = resources.files("gpufleet.node").joinpath("healthcheck.py")


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
        "slurm_healthcheck_xids": Var(list(CRITICAL_XIDS), "list", "Xids that drain"),
        "slurm_healthcheck_nvidia_smi_timeout_s": Var(4, "integer", "nvidia-smi deadline"),
        "slurm_healthcheck_budget_s": Var(9, "integer", "the whole program's deadline"),
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
        for key in ("slurm_healthcheck_path", "slurm_healthcheck_config"):
            v.path(key)
        self.program(v)
        self.config(v)
        if v.get("nccl_env") is not None:
            nccl_env.ROLE.settings(RoleVars(v.host, nccl_env.ROLE.defaults))

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {k: v.string(k) for k in ("slurm_healthcheck_path", "slurm_healthcheck_config")}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(files=frozenset({v.string("slurm_healthcheck_path"),
                                            v.string("slurm_healthcheck_config")}))

    def program(self, v: RoleVars) -> str:
        """The program as installed: its interpreter line and a managed-file note."""
        python = v.path("slurm_healthcheck_python", "the program's interpreter line")
        source = PROGRAM.read_text().split("\n", 1)[1]
        return f"#!{python}\n# {HEADER.format(role=self.name)}\n{source}"

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
                      budget_s=self._seconds(v, "slurm_healthcheck_budget_s", 4))

    @staticmethod
    def _seconds(v: RoleVars, key: str, least: int) -> int:
        value = v.integer(key)
        if not least <= value <= 50:
            raise VarError(f"host {v.host.name}: variable {key} must be {least}-50 seconds "
                           f"(slurmd kills the program after 60), got {value}")
        return value

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        files = [(v.string("slurm_healthcheck_path"), self.program(v), 0o755),
                 (v.string("slurm_healthcheck_config"), self.config(v), 0o644)]
        return [c for path, content, mode in files
                if (c := file_change(self.name, facts, path, content, mode=mode)) is not None]


ROLE = SlurmHealthcheckRole()
