"""The suite registry: every conformance suite declared in one place.

A suite is ``conformance/test_<name>.py``. Its entry here says which sets it belongs to,
which of its checks need other nodes, what bootstrap does with it, which inventory
variables it reads (kind and default, validated for every selected host before any host
is contacted) and which facts it needs beyond the roles' (added to the one facts round
trip). The commands, bootstrap and the pytest plugin read suites only from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from gpufleet.bmc.target import target_of
from gpufleet.conformance import container, verdict
from gpufleet.conformance.checks import allreduce as allreduce_checks
from gpufleet.conformance.checks import bmc as power_checks
from gpufleet.conformance.checks import gpu_generations as generations
from gpufleet.conformance.checks import host_sizing as host_sizing_checks
from gpufleet.conformance.checks import mounts as mounts_checks
from gpufleet.errors import GpufleetError
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.xids import CRITICAL_XIDS
from gpufleet.inventory.model import Host
from gpufleet.ports import PORT_RANGE, RENDEZVOUS_PORT, parse_range
from gpufleet.provision.role import RoleVars, Var

SETS = ("conformance", "acceptance")
ALL = "all"

Predicate = Callable[[Host, "Facts | None"], bool]


def _always(host: Host, facts: Facts | None) -> bool:
    return True


def _has_gpus(host: Host, facts: Facts | None) -> bool:
    return bool(host.vars.get("gpu_count") or (facts and facts.get("pci_gpus")))


def _has_rdma(host: Host, facts: Facts | None) -> bool:
    return bool(facts and facts.get("rdma"))


@dataclass(frozen=True)
class Suite:
    """One suite's declaration.

    ``cross_node``: checks that need other nodes (the rest runs on one node alone);
    ``with_peer``: the cross-node checks bootstrap runs with the new node and its peer;
    ``required_when``: bootstrap runs the suite's node-local checks and, when the predicate
    holds for the node, requires at least one of them to pass; ``records_baseline``: its
    performance figures go into the node's baseline (bootstrap runs it too);
    ``check``: validation beyond each variable's kind (ranges, choices).
    """

    name: str
    sets: tuple[str, ...]
    summary: str
    variables: Mapping[str, Var] = field(default_factory=dict)
    cross_node: frozenset[str] = frozenset()
    with_peer: frozenset[str] = frozenset()
    required_when: Predicate | None = None
    records_baseline: bool = False
    facts: Callable[[Host], FactRequest] | None = None
    check: Callable[[RoleVars], None] | None = None

    @property
    def module(self) -> str:
        return f"test_{self.name}"

    def path(self) -> Path:
        return suites_dir() / f"{self.module}.py"

    def node_local(self, check: str) -> bool:
        """Whether ``check`` (``test_x`` or ``x``) runs on one node without the others."""
        return check.removeprefix("test_") not in self.cross_node

    def vars(self, host: Host) -> RoleVars:
        """The host's values of this suite's variables over their declared defaults."""
        return RoleVars(host, {k: v.default for k, v in self.variables.items()})


def _probe_variables() -> dict[str, Var]:
    """What every suite that launches a torchrun probe reads."""
    return {
        "allreduce_cpu_procs": Var(1, "integer", "processes per node without GPUs"),
        "allreduce_port": Var(None, "integer",
                              "rendezvous port on the first node (default: "
                              "firewall_rendezvous_port)"),
        "firewall_rendezvous_port": Var(RENDEZVOUS_PORT, "integer",
                                        "the rendezvous port the firewall opens"),
        "conformance_python": Var("python3", "string",
                                  "interpreter of the probes that need no torch"),
        **container.VARIABLES,
    }


PERFORMANCE = dict(verdict.VARIABLES)

_GPU = {
    "gpu_count": Var(None, "integer", "GPUs the node must have"),
    "gpu_model": Var(None, "string", "the model every GPU must be"),
    "gpu_nvlink": Var(None, "boolean", "NVLink between every GPU pair (default: when any "
                                       "pair has it)"),
    "gpu_pcie_gen": Var(None, "integer", "PCIe generation of every GPU's link"),
    "gpu_pcie_width": Var(None, "integer", "PCIe width of every GPU's link (default: its "
                                           "maximum)"),
    "gpu_max_temp_c": Var(85, "number", "highest temperature allowed"),
    "gpu_persistence_mode": Var(True, "boolean", "persistence mode must be on"),
    "gpu_critical_xids": Var(list(CRITICAL_XIDS), "list", "Xids that fail the node"),
    "gpu_xid_policy": Var(None, "mapping", "Xid -> fail, warn or ignore, over the default"),
    "gpu_xid_window_h": Var(None, "number", "only Xids of the last N hours count (default: "
                                            "since boot)"),
    "gpu_dcgm_diag_level": Var(1, "integer", "dcgmi diag level (0: off)"),
    "gpu_mixed_models": Var(False, "boolean", "GPUs of several models on a node or in a "
                                              "group are meant"),
}

_SHARED_MOUNTS = Var(None, "list", "[{path, fstype, source, options, writable}]")

_RANGE = {
    "firewall_port_range": Var(PORT_RANGE, "string", "TCP range open to the cluster"),
}

_COUNTERS = {
    "nic_max_drops": Var(100, "integer", "drops one counter of a fabric port may count "
                                         "during one measurement"),
    "nic_max_errors": Var(0, "integer", "errors one counter of a fabric port may count "
                                        "during one measurement"),
    "net_max_retransmit_ratio": Var(0.01, "number", "TCP segments retransmitted per segment "
                                                    "sent during one measurement"),
}


def _check_ranges(v: RoleVars) -> None:
    parse_range(v.string("firewall_port_range"), v.host.name, "firewall_port_range")


def _positive(v: RoleVars, key: str) -> None:
    if v.number(key) <= 0:
        raise v.fail(key, "a number above 0", v.get(key))


def _check_performance(v: RoleVars) -> None:
    verdict.settings(v.host)


def _check_mounts(v: RoleVars) -> None:
    try:
        mounts_checks.declared(v.get("shared_mounts"), f"host {v.host.name}: shared_mounts")
    except ValueError as exc:
        where = v.host.origin("shared_mounts") if "shared_mounts" in v.host.vars else None
        raise GpufleetError(str(exc) + (f" ({where})" if where else "")) from None


def _check_in_image(v: RoleVars) -> None:
    _check_performance(v)
    container.check(v)


def _check_image(v: RoleVars) -> None:
    container.check(v)
    _check_mounts(v)


def _check_network(v: RoleVars) -> None:
    for key in ("net_max_rtt_us", "net_max_jitter_us"):
        _positive(v, key)
    if not 1 <= v.integer("net_ping_count") <= 1000:
        raise v.fail("net_ping_count", "an integer from 1 to 1000", v.get("net_ping_count"))
    mtu = v.get("net_mtu")
    if mtu is not None and not 576 <= v.integer("net_mtu") <= 65535:
        raise v.fail("net_mtu", "an MTU from 576 to 65535", mtu)


def _check_counters(v: RoleVars) -> None:
    for key in ("nic_max_drops", "nic_max_errors"):
        if v.integer(key) < 0:
            raise v.fail(key, "an integer of 0 or more", v.get(key))
    if not 0 <= v.number("net_max_retransmit_ratio") <= 1:
        raise v.fail("net_max_retransmit_ratio", "a number from 0 to 1",
                     v.get("net_max_retransmit_ratio"))


def _check_bmc(v: RoleVars) -> None:
    target_of(v.host)
    for key in ("bmc_max_inlet_c", "bmc_sel_window_h", "bmc_read_budget_s"):
        _positive(v, key)
    if v.number("psu_min_headroom") < 1:
        raise v.fail("psu_min_headroom", "a number of 1 or more", v.get("psu_min_headroom"))
    try:
        power_checks.parse_redundancy(v.get("psu_redundancy"))
    except ValueError:
        raise v.fail("psu_redundancy", "N, N+M or 2N", v.get("psu_redundancy")) from None
    for key in ("rack_power_w", "psu_rating_w"):
        if v.get(key) is not None:
            _positive(v, key)
    if not 0 < v.number("rack_power_margin") <= 1:
        raise v.fail("rack_power_margin", "a number above 0, at most 1",
                     v.get("rack_power_margin"))
    if v.string("rack_cooling") not in ("air", "liquid"):
        raise v.fail("rack_cooling", "air or liquid", v.get("rack_cooling"))
    v.boolean("rack_power_allow_unknown")


def _check_reachability(v: RoleVars) -> None:
    _check_ranges(v)
    _check_counters(v)


def _check_allreduce(v: RoleVars) -> None:
    _check_performance(v)
    _check_ranges(v)
    _check_counters(v)
    allreduce_checks.check_choices(v)
    container.check(v)
    if not 0 < v.number("allreduce_min_line_rate_fraction") <= 1:
        raise v.fail("allreduce_min_line_rate_fraction", "a number above 0, at most 1",
                     v.get("allreduce_min_line_rate_fraction"))
    if v.get("nic_line_rate_gbps") is not None:
        _positive(v, "nic_line_rate_gbps")


SUITES: dict[str, Suite] = {s.name: s for s in [
    Suite("stack", ("conformance",),
          "every role's plan is empty; driver, torch and NCCL settings agree with the node",
          cross_node=frozenset({"versions_agree_within_each_group"}),
          required_when=_always),
    Suite("firewall", ("conformance",),
          "the live ruleset admits the cluster to the rendezvous port and NCCL's range",
          variables={"firewall_read_timeout_s": Var(
              60, "number", "longest the node may take to list its ruleset (bounded by "
                            "what is left of the host's budget)")},
          required_when=_always, check=lambda v: _positive(v, "firewall_read_timeout_s")),
    Suite("reachability", ("conformance",),
          "real TCP connects between nodes on the rendezvous port and across the range",
          variables={
              **_RANGE, **_probe_variables(),
              "firewall_enabled": Var(False, "boolean", "gpufleet manages the firewall"),
              "reachability_range_samples": Var(3, "integer",
                                                "evenly spaced ports of the range per pair"),
              "reachability_random_ports": Var(128, "integer",
                                               "random ports of the range per target"),
              "reachability_seed": Var(None, "integer",
                                       "seed of the random ports (default: new each run)"),
              **_COUNTERS,
          },
          cross_node=frozenset({"reachable_from_the_cluster",
                                "nic_counters_during_reachability"}),
          with_peer=frozenset({"reachable_from_the_cluster"}),
          check=_check_reachability),
    Suite("allreduce", ("conformance",),
          "AllReduce bus bandwidth on each node alone and on all nodes together",
          variables={**allreduce_checks.VARIABLES, **_probe_variables(), **_RANGE,
                     **PERFORMANCE, **_COUNTERS,
                     "nccl_tests_max_size": Var("1G", "string",
                                                "largest size of nccl-tests' all_reduce_perf"),
                     "topology_domain": Var(None, "string", "the node's rack or leaf"),
                     "topology_group_prefixes": Var(None, "list",
                                                    "inventory groups that are topology "
                                                    "domains (default: rack, leaf)")},
          cross_node=frozenset({"all_nodes_together", "nic_counters_during_allreduce"}),
          with_peer=frozenset({"all_nodes_together"}),
          required_when=_always, records_baseline=True, check=_check_allreduce),
    Suite("rdma", ("conformance",),
          "RoCE QoS: PFC, trust, DSCP map and ECN on the RoCE priority; discards",
          variables={"rdma": Var(None, "mapping", "{pfc_priority, trust, ecn}"),
                     "rdma_max_discards": Var(None, "integer", "discards allowed")},
          required_when=_has_rdma),
    Suite("gpu", ("conformance",),
          "GPU count, model, NVLink, PCIe, ECC, Xid, slowdowns, fabric, DCGM, and the "
          "CUDA stack against the GPUs' generation",
          variables=_GPU, cross_node=frozenset({"one_gpu_model_per_group"}),
          required_when=_has_gpus,
          facts=lambda host: FactRequest(custom=frozenset({generations.DRIVER_CUDA}))),
    Suite("ddp", ("acceptance",),
          "DDP training throughput and its scaling within a node and across nodes",
          variables={**_probe_variables(), **PERFORMANCE,
                     "ddp_steps": Var(30, "integer", "timed steps per trial"),
                     "ddp_batch_size": Var(64, "integer", "samples per step and rank"),
                     "ddp_width": Var(None, "integer", "model width (probe's default)"),
                     "ddp_depth": Var(None, "integer", "model depth (probe's default)"),
                     "ddp_timeout_s": Var(600, "number", "limit of each job"),
                     "ddp_min_efficiency": Var(0.85, "number", "scaling within a node"),
                     "ddp_min_efficiency_across_nodes": Var(0.7, "number",
                                                            "scaling across nodes")},
          cross_node=frozenset({"ddp_across_nodes"}), records_baseline=True,
          check=_check_in_image),
    Suite("thermal", ("acceptance",),
          "a sustained GPU load: temperature, clocks against temperature, TFLOPS",
          variables={**PERFORMANCE,
                     "gpu_max_temp_c": _GPU["gpu_max_temp_c"],
                     "thermal_seconds": Var(300, "number", "length of the soak"),
                     "thermal_size": Var(8192, "integer", "matmul size"),
                     "thermal_warmup_s": Var(15, "number", "seconds before the windows"),
                     "thermal_max_temp_c": Var(None, "number",
                                               "highest temperature (default: gpu_max_temp_c)"),
                     "thermal_mirror_threshold": Var(-0.8, "number",
                                                     "clock/temperature correlation that "
                                                     "fails"),
                     "thermal_min_clock_drop": Var(0.05, "number",
                                                   "clock drop that counts as throttling"),
                     "thermal_min_tflops": Var(None, "number", "TFLOPS floor per GPU")},
          records_baseline=True, check=_check_performance),
    Suite("storage", ("acceptance",),
          "dataset reads from every node at one moment: per node and aggregate",
          variables={**PERFORMANCE, **_probe_variables(),
                     "storage_dataset_path": Var(None, "string", "the dataset directory"),
                     "storage_dataset_gb": Var(None, "number", "size of the dataset"),
                     "storage_epoch_minutes": Var(None, "number",
                                                  "time an epoch's reads may take"),
                     "storage_nodes": Var(None, "integer",
                                          "nodes reading at once (default: the selected)"),
                     "storage_file_gb": Var(1, "number", "size of each read file"),
                     "storage_readers": Var(4, "integer", "parallel readers per node"),
                     "storage_small_files": Var(2000, "integer", "small files read"),
                     "storage_min_small_files_per_s": Var(None, "number",
                                                          "small-file read floor"),
                     "storage_timeout_s": Var(900, "number", "limit of each read")},
          cross_node=frozenset({"storage_aggregate"}), records_baseline=True,
          check=_check_performance),
    Suite("host_sizing", ("acceptance",),
          "memory, CPUs, /dev/shm, NUMA affinity and PCIe links sized for the GPUs",
          variables={"host_memory_multiple": Var(1.5, "number",
                                                 "memory per total GPU memory"),
                     "host_min_memory_gb": Var(None, "number", "memory floor"),
                     "host_min_cpus": Var(None, "integer", "CPU floor"),
                     "host_min_cpus_per_gpu": Var(4, "number", "CPUs per GPU"),
                     "host_gpu_numa": Var(None, "mapping", "{GPU0: NUMA node, ...}"),
                     "host_min_shm_gb": Var(1, "number", "size of /dev/shm"),
                     "gpu_pcie_gen": _GPU["gpu_pcie_gen"],
                     "gpu_pcie_width": _GPU["gpu_pcie_width"]},
          facts=lambda host: FactRequest(custom=frozenset({host_sizing_checks.SHM}))),
    Suite("bmc", ("acceptance",),
          "power and cooling from each node's BMC (Redfish): PSUs against the measured "
          "peak, inlet and fans, critical events; each rack's power budget",
          variables={
              "bmc_address": Var(None, "string", "the BMC: host, address, host:port or "
                                                 "https://host[:port] (none: not checked)"),
              "bmc_user": Var(None, "string", "the BMC account (read-only is enough)"),
              "bmc_password": Var(None, "string", "its password (a secret: keep it in a "
                                                  "vault file)"),
              "bmc_ca_file": Var(None, "string", "CA bundle on the controller that the "
                                                 "BMC's certificate chains to (default: "
                                                 "the system's)"),
              "bmc_protocol": Var("redfish", "string", "redfish or ipmi (RMCP+)"),
              "bmc_ipmi_cipher_suite": Var(17, "integer", "the RMCP+ cipher suite"),
              "psu_rating_w": Var(None, "number", "each PSU's rating where the BMC reports "
                                                  "none (IPMI)"),
              "psu_min_headroom": Var(1.3, "number", "healthy PSU rating over the measured "
                                                     "peak"),
              "psu_redundancy": Var(None, "string", "N, N+M or 2N: the PSUs the node must "
                                                    "run without"),
              "bmc_max_inlet_c": Var(35, "number", "highest inlet temperature (C)"),
              "bmc_sel_window_h": Var(24, "number", "critical log entries of the last N "
                                                    "hours fail (the runs' interval)"),
              "bmc_read_budget_s": Var(120, "number", "seconds for the whole reading of one "
                                                      "BMC (every request together)"),
              "rack": Var(None, "string", "the node's rack (default: its first group "
                                          "named rack*)"),
              "rack_power_w": Var(None, "number", "the rack's supply (none: no budget)"),
              "rack_cooling": Var("air", "string", "air or liquid"),
              "rack_power_margin": Var(0.8, "number", "share of the supply the measured "
                                                      "peaks may use"),
              "rack_power_allow_unknown": Var(False, "boolean", "bootstrap admits a node "
                                              "while rack members' peaks are unknown"),
          },
          cross_node=frozenset({"rack_power_budget"}), records_baseline=True,
          check=_check_bmc),
    Suite("mounts", ("acceptance",),
          "the shared filesystems mounted alike on every node, and the same filesystem",
          variables={"shared_mounts": _SHARED_MOUNTS},
          cross_node=frozenset({"same_filesystem", "mounts_agree_within_each_group"}),
          facts=lambda host: FactRequest(custom=frozenset({mounts_checks.MOUNTINFO})),
          check=_check_mounts),
    Suite("network", ("acceptance",),
          "one layer-2 domain, the fabric's MTU on every path, round trips and jitter",
          variables={"net_mtu": Var(None, "integer",
                                    "the fabric's MTU (default: the MTU most nodes' "
                                    "inventory interfaces have)"),
                     "net_max_rtt_us": Var(1000, "number", "smallest round trip allowed"),
                     "net_max_jitter_us": Var(1000, "number",
                                              "spread of the round trips allowed (10th to "
                                              "90th percentile)"),
                     "net_ping_count": Var(10, "integer", "echoes per pair")},
          cross_node=frozenset({"one_layer2_domain", "path_mtu", "round_trip_time"}),
          check=_check_network),
    Suite("p2p", ("acceptance",),
          "GPU-to-GPU and host-to-GPU copy bandwidth",
          variables={**PERFORMANCE,
                     "p2p_min_gbps": Var(None, "mapping", "{MODEL: GB/s} between GPUs"),
                     "h2d_min_gbps": Var(None, "mapping", "{MODEL: GB/s} host to GPU"),
                     "p2p_size_mb": Var(1024, "integer", "size of each copy"),
                     "p2p_timeout_s": Var(600, "number", "limit of the probe"),
                     **container.VARIABLES},
          records_baseline=True, check=_check_in_image),
    Suite("image", (),
          "the fleet's training image on every node: it starts under the NVIDIA runtime, "
          "sees every GPU, its CUDA runs on the node's driver, its NCCL and torch are the "
          "fleet's, /dev/shm, RDMA devices and shared mounts inside, one image per group",
          variables={**container.VARIABLES, "shared_mounts": _SHARED_MOUNTS},
          cross_node=frozenset({"image_agrees_within_each_group"}),
          facts=lambda host: FactRequest(custom=frozenset({
              generations.DRIVER_CUDA, container.GPU_BRAND, mounts_checks.MOUNTINFO})),
          check=_check_image),
]}


def suites_dir() -> Path:
    """Where the suites are installed (they are files pytest collects)."""
    path = Path(str(resources.files("gpufleet.suites")))
    if not path.is_dir():
        raise GpufleetError(f"gpufleet's conformance suites are not on a filesystem ({path}); "
                            "install gpufleet unzipped")
    return path


def suite(name: str) -> Suite:
    return SUITES[name]


def select(names: str | Sequence[str] | None) -> list[Suite]:
    """Suites named in a comma-separated list or sequence of suites and sets
    (``conformance`` when None; ``all``), each once, in the order asked."""
    given = names.split(",") if isinstance(names, str) else list(names or ["conformance"])
    wanted: list[str] = []
    for name in (n.strip() for n in given if n.strip()):
        if name == ALL:
            members = list(SUITES)
        elif name in SETS:
            members = [s.name for s in SUITES.values() if name in s.sets]
        else:
            members = [name]
        wanted += [m for m in members if m not in wanted]
    unknown = [s for s in wanted if s not in SUITES]
    if unknown or not wanted:
        raise GpufleetError(f"unknown suite(s) {', '.join(unknown) or 'none given'}; suites are "
                            f"{', '.join(SUITES)}; sets are {', '.join([*SETS, ALL])}")
    return [SUITES[s] for s in wanted]


def defaults() -> dict[str, object]:
    """Every suite variable's default (a variable several suites read has one default)."""
    merged: dict[str, Var] = {}
    for entry in SUITES.values():
        for key, var in entry.variables.items():
            if merged.setdefault(key, var) != var:
                raise AssertionError(f"suite variable {key} is declared twice differently")
    return {k: v.default for k, v in merged.items()}


def validate(hosts: Iterable[Host], suites: Sequence[Suite], most: int = 20) -> None:
    """Every selected suite's variables on every host, by kind and by the suite's own
    check; a BadVariables error lists the problems (host, variable, file:line)."""
    from gpufleet.provision.engine import BadVariables  # noqa: PLC0415 - engine imports heavy

    problems: list[str] = []
    for host in hosts:
        for entry in suites:
            v = entry.vars(host)
            try:
                for key, var in entry.variables.items():
                    if v.get(key) is not None:
                        v.checked(key, var.kind)
                if entry.check is not None:
                    entry.check(v)
            except GpufleetError as exc:
                if str(exc) not in problems:
                    problems.append(str(exc))
    if problems:
        more = f" (and {len(problems) - most} more)" if len(problems) > most else ""
        raise BadVariables("; ".join(problems[:most]) + more)


def facts_request(host: Host, suites: Sequence[Suite]) -> FactRequest:
    """The facts the selected suites need beyond the roles'."""
    request = FactRequest()
    for entry in suites:
        if entry.facts is not None:
            request = request | entry.facts(host)
    return request


def bootstrap_suites() -> list[Suite]:
    """The suites bootstrap runs on the new node alone: the required ones and those that
    record its baseline."""
    return [s for s in SUITES.values() if s.required_when is not None or s.records_baseline]


def peer_suites() -> list[Suite]:
    """The suites whose cross-node checks bootstrap runs with the new node and its peer."""
    return [s for s in SUITES.values() if s.with_peer]


def required(host: Host, facts: Facts | None) -> list[str]:
    """The suites that must each pass a check for ``host`` to be certified: the inventory's
    ``bootstrap_required_suites``, else those whose condition holds on the node."""
    choosable = [s.name for s in SUITES.values() if s.required_when is not None]
    configured = RoleVars(host, {"bootstrap_required_suites": None}).items(
        "bootstrap_required_suites")
    if configured:
        unknown = [str(s) for s in configured if s not in choosable]
        if unknown:
            raise GpufleetError(f"host {host.name}: bootstrap_required_suites names "
                                f"{', '.join(unknown)}; the suites bootstrap can require are "
                                f"{', '.join(choosable)}")
        return [str(s) for s in configured]
    return [s.name for s in SUITES.values()
            if s.required_when is not None and s.required_when(host, facts)]
