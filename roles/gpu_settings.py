"""The GPUs' standing state: MIG mode, ECC mode, the power limit, application clocks, locked
clocks and the compute mode, against the declared values (``gpu_state_*``; the defaults:
MIG off, ECC on, each GPU's own default power limit and application clocks, no locked clocks,
compute mode Default).

On by default on the GPU nodes gpufleet manages (a pinned driver, as host_tuning's ``auto``),
where drift reports every GPU whose state differs. gpufleet sets only the settings the
inventory names in ``gpu_state_manage`` (none by default): each is set now (``nvidia-smi``)
and at every boot by ``gpufleet-gpu-settings.service``, as DGX OS and DeepOps do, since the
driver forgets the power limit, clocks and compute mode when it unloads. A difference in a
setting not managed is a manual change: reported, never written. MIG and ECC changes take
effect at the next GPU reset or reboot (the change says so).

Persistence mode has one home, the persistenced role (``nvidia_persistence_mode``: through
nvidia-persistenced); the gpu_state suite checks it (``gpu_persistence_mode``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from gpufleet.facts import gpu_state
from gpufleet.facts.catalog import SYSTEMD
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.provision.managed import HEADER, file_change, link_change, render
from gpufleet.provision.plan import MANUAL, Change, Fail, Run, Step
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var
from gpufleet.roles.driver import driver_version

SCRIPT = "/etc/gpufleet/gpu-settings.sh"
UNIT = "/etc/systemd/system/gpufleet-gpu-settings.service"
UNIT_LINK = "/etc/systemd/system/multi-user.target.wants/gpufleet-gpu-settings.service"
MANAGEABLE = ("mig", "ecc", "power_limit", "app_clocks", "locked_clocks", "compute_mode")
"""What the role can set: every setting gpu_state judges but persistence (persistenced's)."""
MAX_POWER_W = 5000.0
_BOOL_TEXT = re.compile(r"^(auto|true|false|yes|no|on|off)$", re.IGNORECASE)

VARIABLES: Mapping[str, Var] = {
    "gpu_state_mig": Var(False, "boolean", "the MIG mode of every GPU (null: not judged)"),
    "gpu_state_ecc": Var(True, "boolean", "the ECC mode of every GPU that has ECC (null: not "
                                          "judged)"),
    "gpu_state_power_limit_w": Var(None, "number", "every GPU's power limit in watts (null: "
                                                   "each GPU's own default limit)"),
    "gpu_state_app_clocks": Var(None, "string", "application clocks 'memory,graphics' in MHz, "
                                                "as nvidia-smi -ac takes them (null: each "
                                                "GPU's defaults)"),
    "gpu_state_locked_clocks": Var(False, "boolean", "clocks locked by nvidia-smi -lgc/-lmc "
                                                     "are meant (false: a lock is a finding)"),
    "gpu_state_compute_mode": Var("Default", "string", "Default, Exclusive_Process or "
                                                       "Prohibited (null: not judged)"),
}
"""The declared GPU state, shared with the gpu_state suite (``roles.gpu_state_settings``)."""


def declared(v: RoleVars) -> gpu_state.Declared:
    """The declared state of ``v``'s host (persistence is not the role's: None); a bad
    value fails naming it."""
    check_declared(v)

    def flag(key: str) -> bool | None:
        return None if v.get(key) is None else v.boolean(key)

    power = v.get("gpu_state_power_limit_w")
    clocks = v.opt_string("gpu_state_app_clocks")
    return gpu_state.Declared(
        mig=flag("gpu_state_mig"), ecc=flag("gpu_state_ecc"), persistence=None,
        power_limit_w=None if power is None else v.number("gpu_state_power_limit_w"),
        app_clocks=None if clocks is None else gpu_state.parse_app_clocks(clocks),
        locked_clocks=bool(flag("gpu_state_locked_clocks")),
        compute_mode=compute_mode(v))


def compute_mode(v: RoleVars) -> str | None:
    """``gpu_state_compute_mode`` as nvidia-smi prints it (any case accepted), or None."""
    value = v.opt_string("gpu_state_compute_mode")
    if value is None:
        return None
    found = next((m for m in gpu_state.COMPUTE_MODES if m.lower() == value.lower()), None)
    if found is None:
        raise v.fail("gpu_state_compute_mode", "one of " + ", ".join(gpu_state.COMPUTE_MODES),
                     value)
    return found


def check_declared(v: RoleVars) -> None:
    """Every ``gpu_state_*`` value valid for the syntax it lands in (nvidia-smi's options)."""
    for key, var in VARIABLES.items():
        if v.get(key) is not None:
            v.checked(key, var.kind)
    power = v.get("gpu_state_power_limit_w")
    if power is not None and not 0 < v.number("gpu_state_power_limit_w") <= MAX_POWER_W:
        raise v.fail("gpu_state_power_limit_w", f"watts above 0, at most {MAX_POWER_W:g}",
                     power)
    clocks = v.opt_string("gpu_state_app_clocks")
    if clocks is not None:
        try:
            gpu_state.parse_app_clocks(clocks)
        except ValueError:
            raise v.fail("gpu_state_app_clocks", "'memory,graphics' in MHz (3201,1980)",
                         clocks) from None
    compute_mode(v)


class GpuSettingsRole(RoleBase):
    name = "gpu_settings"
    order = 28
    variables: ClassVar[Mapping[str, Var]] = {
        "gpu_settings": Var("auto", "any", "true, false, or auto: on GPU nodes (where "
                                           "nvidia_driver_version is set)"),
        "nvidia_driver_version": Var(None, "string", "the pinned driver that makes a host a "
                                                     "GPU node (for auto)"),
        **VARIABLES,
        "gpu_state_manage": Var([], "list", "the settings gpufleet sets now and at boot: "
                                            + ", ".join(MANAGEABLE) + " (none: report only)"),
    }

    def active(self, v: RoleVars) -> bool:
        """On when asked; with auto, on the GPU nodes gpufleet manages (a pinned driver)."""
        if str(v.get("gpu_settings")).lower() == "auto":
            return "nvidia_driver_version" in v
        return v.boolean("gpu_settings")

    def check(self, v: RoleVars) -> None:
        super().check(v)
        value = v.get("gpu_settings")
        if not isinstance(value, bool) and not _BOOL_TEXT.match(str(value)):
            raise v.fail("gpu_settings", "true, false or auto", value)
        if v.opt_string("nvidia_driver_version") is not None:
            driver_version(v)
        check_declared(v)
        self.managed(v)

    @staticmethod
    def managed(v: RoleVars) -> tuple[str, ...]:
        """``gpu_state_manage``: settings of MANAGEABLE, each once."""
        names = v.items("gpu_state_manage")
        if not all(isinstance(n, str) and n in MANAGEABLE for n in names) or \
                len(set(names)) != len(names):
            raise v.fail("gpu_state_manage", "a list of distinct settings of "
                         + ", ".join(MANAGEABLE), v.get("gpu_state_manage"))
        return tuple(names)

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {"boot script": SCRIPT, "boot unit": UNIT} if self.managed(v) else {}

    def request(self, v: RoleVars) -> FactRequest:
        if not self.managed(v):
            return FactRequest()
        return FactRequest(files=frozenset({SCRIPT, UNIT}), links=frozenset({UNIT_LINK}),
                           custom=frozenset({SYSTEMD}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        manage = self.managed(v)
        want = declared(v)
        gpus: list[dict[str, Any]] | None = facts.get("gpus")
        if gpus is None:
            if not manage:  # nothing to set: the gpu_state suite reports the unknown state
                return []
            reason = facts.why_absent("gpus")
            return [Change(self.name, "gpu settings", "verify", f"unknown ({reason})",
                           ", ".join(manage) + " as declared",
                           [Fail(f"the GPUs' state cannot be read: {reason}")])]
        found = [d for d in gpu_state.differences(gpus, want, MANAGEABLE) if not d.unknown]
        changes: list[Change] = []
        for setting in MANAGEABLE:
            here = [d for d in found if d.setting == setting]
            if here:
                changes.append(self._change(setting, here, gpus, want, setting in manage))
        return self._files(facts, manage, want) + changes

    def _change(self, setting: str, found: list[gpu_state.Difference],
                gpus: list[dict[str, Any]], want: gpu_state.Declared,
                managed: bool) -> Change:
        resource = f"gpu {setting}"
        before = "; ".join(f"{d.gpu} {d.seen}" for d in found)
        after = "; ".join(sorted({d.expected for d in found}))
        if not managed:
            return Change(self.name, resource, MANUAL, before,
                          f"{after} ({gpu_state.VARIABLES[setting]}; add {setting} to "
                          "gpu_state_manage for gpufleet to set it)")
        indexes = [d.gpu.removeprefix("GPU") for d in found]
        steps: list[Step] = [Run(command, command)
                             for command in now_commands(setting, want, gpus, indexes)]
        return Change(self.name, resource, "set", before, after, steps,
                      pending_reboot=setting in ("mig", "ecc"))

    def _files(self, facts: Facts, manage: tuple[str, ...],
               want: gpu_state.Declared) -> list[Change]:
        commands = [c for setting in manage for c in boot_commands(setting, want)]
        if not commands or not facts.require("systemd"):
            return []
        header = HEADER.format(role=self.name)
        changes = [
            file_change(self.name, facts, SCRIPT, render("gpu-settings.sh.j2", header=header,
                                                         commands=commands), mode=0o755),
            file_change(self.name, facts, UNIT, render("gpufleet-gpu-settings.service.j2",
                                                       header=header, script=SCRIPT)),
            link_change(self.name, facts, UNIT_LINK, "../gpufleet-gpu-settings.service"),
        ]
        return [c for c in changes if c is not None]


def _mode(flag: bool | None) -> int:
    return 1 if flag else 0


def boot_commands(setting: str, want: gpu_state.Declared) -> list[str]:
    """What the boot unit runs for a managed setting, on every GPU (the driver's own default
    power limit needs no command: it comes back when the driver loads)."""
    clocks = want.app_clocks
    commands = {
        "mig": [] if want.mig is None else [f"nvidia-smi -mig {_mode(want.mig)}"],
        "ecc": [] if want.ecc is None else [f"nvidia-smi -e {_mode(want.ecc)}"],
        "power_limit": [] if want.power_limit_w is None else
        [f"nvidia-smi -pl {want.power_limit_w:g}"],
        "app_clocks": [f"nvidia-smi -ac {clocks[0]},{clocks[1]}" if clocks else
                       "nvidia-smi -rac"],
        "locked_clocks": [] if want.locked_clocks else ["nvidia-smi -rgc", "nvidia-smi -rmc"],
        "compute_mode": [] if want.compute_mode is None else
        [f"nvidia-smi -c {want.compute_mode.upper()}"],
    }
    return commands[setting]


def now_commands(setting: str, want: gpu_state.Declared, gpus: list[dict[str, Any]],
                 indexes: list[str]) -> list[str]:
    """What puts a managed setting right now on the GPUs ``indexes``: the boot commands,
    or, for the default power limit, each GPU's own."""
    if setting == "power_limit" and want.power_limit_w is None:
        limits = {str(g.get("index")): g.get(gpu_state.POWER_DEFAULT) for g in gpus}
        return [f"nvidia-smi -i {i} -pl {limit:g}" for i in indexes
                if i.isdigit() and isinstance(limit := limits.get(i), int | float)]
    return boot_commands(setting, want)


ROLE = GpuSettingsRole()
