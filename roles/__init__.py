"""The roles gpufleet applies: every module of this package that exports ``ROLE``, in the
order the roles declare (the NVIDIA repository first, the stack, configuration, the
firewall last). Adding a role is adding a module here."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

from gpufleet.errors import GpufleetError
from gpufleet.facts import catalog, gpu_state
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.inventory.model import Host, Inventory
from gpufleet.provision.engine import active_roles, fact_request
from gpufleet.provision.role import PlanContext, Role, RoleVars, Var


def _discover() -> list[Role]:
    found: list[Role] = []
    for module in pkgutil.iter_modules(__path__):
        role = getattr(importlib.import_module(f"{__name__}.{module.name}"), "ROLE", None)
        if role is not None:
            found.append(role)
    return sorted(found, key=lambda r: (r.order, r.name))


ALL: list[Role] = _discover()


def select(names: str | None) -> list[Role]:
    """Roles named in a comma-separated list (all when None), in application order."""
    if not names:
        return list(ALL)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {r.name for r in ALL}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise GpufleetError(f"unknown role(s) {', '.join(unknown)}; roles are "
                            f"{', '.join(r.name for r in ALL)}")
    return [r for r in ALL if r.name in wanted]


def provided(host: Host, key: str, default: str) -> str:
    """A value a role offers under ``key`` for ``host`` (``training_python`` ...), else
    ``default``."""
    for role in ALL:
        value = role.provides(RoleVars(host, role.defaults)).get(key)
        if value is not None:
            return value
    return default


def owner_of(key: str) -> str | None:
    """The role that owns the shared value ``key`` (it reports it as its own drift)."""
    return next((role.name for role in ALL if key in role.shared_keys), None)


def training_python(host: Host) -> str:
    """The interpreter that trains on the host (as the roles say), else python3."""
    return provided(host, "training_python", "python3")


def torch_pin_problems(torch: dict[str, object], host: Host) -> list[str]:
    """What differs between a torch's own report (``torch``, ``cuda``, ``nccl``) and the
    host's pytorch pins (empty when the pytorch role pins nothing)."""
    from gpufleet.roles.pytorch import ROLE, verify  # noqa: PLC0415 - the registry's own module

    v = RoleVars(host, ROLE.defaults)
    if not ROLE.active(v):
        return []
    return verify(torch, v.string("pytorch_version"), v.opt_string("pytorch_cuda"),
                  v.opt_string("pytorch_nccl"))


def job_limits() -> dict[str, Var]:
    """The declarations of the limits a Slurm job must get (``slurm_job_memlock``,
    ``slurm_job_nofile``), shared by the slurm_node role and the suites that check them."""
    from gpufleet.roles.slurm_node import ROLE  # noqa: PLC0415 - the registry's own module

    return {key: ROLE.variables[key] for key in ("slurm_job_memlock", "slurm_job_nofile")}


def clock_settings() -> dict[str, Var]:
    """The declarations of the clock's bound (``time_max_offset_ms``, ``time_check_offset``),
    shared by the slurm_healthcheck role (which hands them to the node's health check) and
    the clock suite."""
    from gpufleet.roles.slurm_healthcheck import ROLE  # noqa: PLC0415 - the registry's own module

    return {key: ROLE.variables[key] for key in ("time_max_offset_ms", "time_check_offset")}


def pcie_settings() -> dict[str, Var]:
    """The declarations the pcie role and the pcie suite share (``pcie_sys_root``,
    ``pcie_iommu_passthrough``)."""
    from gpufleet.roles.pcie import ROLE  # noqa: PLC0415 - the registry's own module

    return {key: ROLE.variables[key] for key in ("pcie_sys_root", "pcie_iommu_passthrough")}


def gpudirect_settings() -> dict[str, Var]:
    """The declaration of where the node's module state is read (``kernel_state_root``),
    shared by the peermem role and the gpudirect suite."""
    from gpufleet.roles.peermem import ROLE  # noqa: PLC0415 - the registry's own module

    return {key: ROLE.variables[key] for key in ("kernel_state_root",)}


def gpudirect_request(host: Host) -> FactRequest:
    """The ``gpudirect`` fact read under the host's ``kernel_state_root`` (the peermem role's
    own reading)."""
    from gpufleet.roles.peermem import ROLE, state_root  # noqa: PLC0415 - as above

    v = RoleVars(host, ROLE.defaults)
    return FactRequest(custom=frozenset({catalog.gpudirect_fact(state_root(v))}))


def gpu_state_settings() -> dict[str, Var]:
    """The declared GPU state (``gpu_state_*``), shared by the gpu_settings role (which
    reports and sets it) and the gpu_state suite (which judges it)."""
    from gpufleet.roles.gpu_settings import VARIABLES  # noqa: PLC0415 - as clock_settings

    return dict(VARIABLES)


def gpu_state_declared(host: Host) -> gpu_state.Declared:
    """``host``'s declared GPU state as the gpu_settings role reads it (persistence: None,
    the gpu_state suite's own ``gpu_persistence_mode``)."""
    from gpufleet.roles.gpu_settings import ROLE, declared  # noqa: PLC0415 - as above

    return declared(ROLE.vars(host))


def job_memlock_kib(v: RoleVars) -> int | None:
    """``slurm_job_memlock`` in KiB, None for unlimited; a bad value fails naming it."""
    from gpufleet.roles.slurm_node import SlurmNodeRole  # noqa: PLC0415 - as above

    return SlurmNodeRole.memlock_kib(v)


def host_request(host: Host) -> FactRequest:
    """What every command that reads a host's state asks it (``facts``, bootstrap's
    preflight, the conformance session): its active roles' facts, the consistency values
    and, where the watch is in use, its last report."""
    return fact_request(active_roles(host, ALL)) | consistency_request(host) | \
        watch_request(host)


# The standing watch's variables where the slurm_healthcheck role does not declare them:
# its declarations, when it has them, come first.
WATCH_MAX_AGE = Var(1800, "number",
                    "seconds: a standing-watch report older than this says the watch stopped "
                    "running (the watch check fails naming its age, drift reports it); the "
                    "default is six missed 5-minute runs")
WATCH_DEFAULTS = {"node_watch": True, "node_watch_path": "/usr/local/sbin/gpufleet-watch",
                  "node_watch_config": "/etc/gpufleet/watch.json",
                  "watch_max_age_s": WATCH_MAX_AGE.default}


@dataclass(frozen=True)
class WatchSetup:
    """Where the standing watch is on a host: the program, its configuration, the
    directory that keeps its state, silences and last report, and the age past which that
    report says the watch stopped running."""

    program: str
    config: str
    state_dir: str
    max_age_s: float = WATCH_MAX_AGE.default


def watch_setup(host: Host) -> WatchSetup | None:
    """The watch the slurm_healthcheck role installs on ``host``, None when it installs none
    (the role inactive, or ``node_watch`` false); VarError for a path it cannot use."""
    from gpufleet.roles.slurm_healthcheck import ROLE  # noqa: PLC0415 - the registry's own

    v = RoleVars(host, {**WATCH_DEFAULTS, **ROLE.defaults})
    if not ROLE.active(v) or (v.get("node_watch") is not None and not v.boolean("node_watch")):
        return None
    max_age = v.number("watch_max_age_s")
    if max_age <= 0:
        raise v.fail("watch_max_age_s", "a number above 0", v.get("watch_max_age_s"))
    return WatchSetup(v.path("node_watch_path", "the watch program"),
                      v.path("node_watch_config", "the watch's configuration"),
                      v.path("slurm_healthcheck_state_dir"), max_age)


def watch_request(host: Host) -> FactRequest:
    """The watch's last report, where the watch is in use (nothing elsewhere)."""
    setup = watch_setup(host)
    if setup is None:
        return FactRequest()
    return FactRequest(custom=frozenset({catalog.watch_fact(setup.state_dir)}))


def consistency_request(host: Host) -> FactRequest:
    """Facts the consistency check compares even where the inventory pins nothing."""
    request = FactRequest()
    for role in ALL:
        request = request | role.shared_request(RoleVars(host, role.defaults))
    return request


def comparable(facts: Facts, host: Host) -> dict[str, str]:
    """The values every node of a training job must share: the kernel, and what each role
    shares (the driver, CUDA, NCCL, torch, nccl.conf, the port range ...)."""
    values: dict[str, str | None] = {"kernel": facts.get("kernel")}
    for role in ALL:
        values.update(role.shared(facts, RoleVars(host, role.defaults)))
    return {key: "absent" if value is None else str(value) for key, value in values.items()}


@dataclass(frozen=True)
class FirewallIntent:
    """What the firewall role opens on a host, for the suites that check it: the cluster's
    source addresses (the host's own left out), the TCP ports, and the ruleset file."""

    sources: list[str]
    ports: list[tuple[int, int]]
    ruleset_path: str


def firewall_intent(inventory: Inventory, host: Host) -> FirewallIntent:
    """The firewall role's intent for ``host`` (VarError for a variable it cannot use)."""
    from gpufleet.roles.firewall import (  # noqa: PLC0415 - the registry's own module
        NAMED_SOURCES,
        ROLE,
    )

    v = RoleVars(host, ROLE.defaults)
    ctx = PlanContext(inventory, host)
    members = ROLE.cluster_members(v, ctx)
    if len(members) > NAMED_SOURCES:  # a large cluster: its prefixes, a flat cost per node
        networks = ROLE.cluster_networks(v, ctx)
        sources = [*networks["ipv4"], *networks["ipv6"]]
    else:
        sources = [s.removesuffix("/32").removesuffix("/128")
                   for s in ROLE.cluster_sources(v, ctx) if s.split("/")[0] != host.address]
    return FirewallIntent(sources, ROLE.ports(v), ROLE.backend(v).path)
