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
With ``node_watch`` (the default) it also installs the standing watch
(``gpufleet/node/watch.py``) as ``/usr/local/sbin/gpufleet-watch`` and its configuration
``/etc/gpufleet/watch.json``, which the health check's ``watch`` check runs at every health
check; with ``node_watch_timer`` a systemd timer also runs it every 5 minutes, for nodes
where Slurm does not run the health check. slurm.conf then names them as
``HealthCheckProgram``, ``Prolog`` and ``Epilog`` (see docs/slurm.md); the slurm_node role
declares the same four prolog/epilog variables, with the same defaults, to check those
lines.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from importlib import resources
from typing import Any, ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.catalog import SYSTEMD
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.node import watch as watch_node
from gpufleet.provision.managed import HEADER, file_change, link_change, render
from gpufleet.provision.plan import Change, Run
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var
from gpufleet.roles import nccl_env, pytorch, slurm_node

# Where bootstrap records the node's versions (gpufleet.bootstrap.STATE_FILE); not imported,
# because bootstrap imports the role registry.
STATE_FILE = "/etc/gpufleet/node.json"
PROGRAM = resources.files("gpufleet.node").joinpath("healthcheck.py")
GANG_CHECK = resources.files("gpufleet.node").joinpath("gang_check.py")
WATCH = resources.files("gpufleet.node").joinpath("watch.py")
WATCH_UNITS = {"service": "/etc/systemd/system/gpufleet-watch.service",
               "timer": "/etc/systemd/system/gpufleet-watch.timer"}
WATCH_TIMER_LINK = "/etc/systemd/system/timers.target.wants/gpufleet-watch.timer"
WATCH_INTERVAL = "5min"
SLURM_RESERVE_S = 3  # gpufleet-healthcheck keeps this much of its budget for scontrol
OTHER_CHECKS_S = 2  # and gives its other checks at least this much before the watch's turn
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
        "node_watch": Var(True, "boolean", "install gpufleet-watch, which the health check "
                                           "runs"),
        "node_watch_path": Var("/usr/local/sbin/gpufleet-watch", "string",
                               "where the watch program goes"),
        "node_watch_config": Var("/etc/gpufleet/watch.json", "string",
                                 "the watch's configuration"),
        "node_watch_textfile_dir": Var(None, "string", "node_exporter's textfile directory, "
                                                       "for gpufleet_watch.prom; unset: none"),
        "node_watch_rules": Var({}, "mapping", "overrides of the watch's rules "
                                               "(docs/watch.md): rule -> setting -> value"),
        "node_watch_sys_root": Var("/sys", "string", "where the watch reads sysfs (the lab "
                                                     "points it at a tree of counters)"),
        "node_watch_timer": Var(False, "boolean", "a systemd timer runs the watch every 5 "
                                                  "minutes (nodes without Slurm's health "
                                                  "check)"),
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
        if v.boolean("node_watch"):
            self.watch_program(v)
            self.watch_config(v)
            if v.boolean("node_watch_timer"):
                self.watch_units(v)
        if v.get("nccl_env") is not None:
            nccl_env.ROLE.settings(RoleVars(v.host, nccl_env.ROLE.defaults))

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        watch = v.boolean("node_watch")
        keys = ["slurm_healthcheck_path", "slurm_healthcheck_config",
                *(path for flag, path in WRAPPERS.values() if v.boolean(flag)),
                *(["slurm_gang_check_path"] if v.boolean("slurm_gang_check") else []),
                *(["node_watch_path", "node_watch_config"] if watch else [])]
        files = {k: v.string(k) for k in keys}
        if watch and v.boolean("node_watch_timer"):
            files.update({f"watch {kind} unit": path for kind, path in WATCH_UNITS.items()})
        return files

    def request(self, v: RoleVars) -> FactRequest:
        timer = v.boolean("node_watch") and v.boolean("node_watch_timer")
        return FactRequest(files=frozenset(self.managed_files(v).values()),
                           links=frozenset({WATCH_TIMER_LINK} if timer else set()),
                           custom=frozenset({SYSTEMD} if timer else set()))

    def program(self, v: RoleVars) -> str:
        """The program as installed: its interpreter line and a managed-file note."""
        python = v.path("slurm_healthcheck_python", "the program's interpreter line")
        source = PROGRAM.read_text().split("\n", 1)[1]
        return f"#!{python}\n# {HEADER.format(role=self.name)}\n{source}"

    def watch_program(self, v: RoleVars) -> str:
        """gpufleet-watch as installed: the same interpreter line as the health check's."""
        python = v.path("slurm_healthcheck_python", "the program's interpreter line")
        v.path("node_watch_path", "the watch program")
        source = WATCH.read_text().split("\n", 1)[1]
        return f"#!{python}\n# {HEADER.format(role=self.name)}\n{source}"

    def watch_config(self, v: RoleVars) -> str:
        """watch.json: where the watch keeps its state and reads its sources, its budget and
        the site's rule overrides, validated here rather than on the node."""
        v.path("node_watch_config", "the watch's configuration")
        textfile = None
        if v.get("node_watch_textfile_dir") not in (None, ""):
            textfile = v.path("node_watch_textfile_dir", "node_exporter's textfile directory")
        return render("gpufleet-watch.json.j2", header=HEADER.format(role=self.name),
                      state_dir=v.path("slurm_healthcheck_state_dir"), textfile_dir=textfile,
                      sys_root=v.path("node_watch_sys_root", "the watch's sysfs"),
                      budget_s=self.watch_budget(v), rules=self.watch_rules(v))

    def watch_budget(self, v: RoleVars) -> int:
        """The watch's own budget: what the health check leaves it, its budget less the
        scontrol reserve and the other checks' time (at least 1 s)."""
        budget = self._seconds(v, "slurm_healthcheck_budget_s", 4)
        return max(1, budget - SLURM_RESERVE_S - OTHER_CHECKS_S)

    @staticmethod
    def watch_rules(v: RoleVars) -> dict[str, Any]:
        """node_watch_rules, checked by the watch's own rules: rule -> setting -> value
        (docs/watch.md)."""
        rules = v.mapping("node_watch_rules")
        if not all(isinstance(rule, str) and (not isinstance(settings, dict) or all(
                isinstance(key, str) for key in settings)) for rule, settings in rules.items()):
            raise v.fail("node_watch_rules", "a mapping of rule names to settings", rules)
        try:
            watch_node.load_rules("node_watch_rules", rules)
        except watch_node.ConfigError as exc:
            where = v.host.origin("node_watch_rules")
            raise VarError(f"host {v.host.name}: variable {exc}"
                           + (f" ({where})" if where else "")) from None
        return rules

    def watch_units(self, v: RoleVars) -> dict[str, str]:
        """gpufleet-watch.service (one observation) and gpufleet-watch.timer (every
        WATCH_INTERVAL), for nodes where Slurm's health check does not run the watch."""
        exec_start = " ".join(shlex.quote(x) for x in (
            v.path("node_watch_path"), "--config", v.path("node_watch_config")))
        header = HEADER.format(role=self.name)
        return {kind: render(f"gpufleet-watch.{kind}.j2", header=header, exec_start=exec_start,
                             interval=WATCH_INTERVAL)
                for kind in WATCH_UNITS}

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
        watch = v.boolean("node_watch")
        return render("gpufleet-healthcheck.json.j2", header=HEADER.format(role=self.name),
                      gpu_count=count, critical_xids=xids, port_range=port_range,
                      state_file=STATE_FILE,
                      nvidia_smi_timeout_s=self._seconds(v, "slurm_healthcheck_nvidia_smi_"
                                                            "timeout_s", 1),
                      budget_s=self._seconds(v, "slurm_healthcheck_budget_s", 4),
                      watch_program=v.path("node_watch_path", "the watch program")
                      if watch else None,
                      watch_config=v.path("node_watch_config", "the watch's configuration")
                      if watch else None,
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
        if v.boolean("node_watch"):
            files += [(v.string("node_watch_path"), self.watch_program(v), 0o755),
                      (v.string("node_watch_config"), self.watch_config(v), 0o644)]
        changes = [c for path, content, mode in files
                   if (c := file_change(self.name, facts, path, content, mode=mode)) is not None]
        if v.boolean("node_watch") and v.boolean("node_watch_timer"):
            changes += self._watch_timer(facts, v)
        return changes

    def _watch_timer(self, facts: Facts, v: RoleVars) -> list[Change]:
        """The timer's units and its timers.target link; where systemd runs, a changed unit
        is read and the timer (re)started."""
        units = self.watch_units(v)
        changes = [c for kind, path in WATCH_UNITS.items()
                   if (c := file_change(self.name, facts, path, units[kind])) is not None]
        link = link_change(self.name, facts, WATCH_TIMER_LINK, "../gpufleet-watch.timer")
        changes += [link] if link else []
        if changes and facts.get("systemd"):
            changes.append(Change(self.name, "service gpufleet-watch.timer", "restart",
                                  "units changed", f"every {WATCH_INTERVAL}",
                                  [Run("systemctl daemon-reload", "systemctl daemon-reload"),
                                   Run("systemctl restart gpufleet-watch.timer",
                                       "start the watch's timer")], kind="service"))
        return changes


ROLE = SlurmHealthcheckRole()
