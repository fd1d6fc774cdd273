"""``gpufleet tune``: the DDP probe and the AllReduce probe across the selected nodes under
the current environment and under each candidate, in rounds, and a winner only where it
beats the current setting by more than the noise, written as a diff of the group's own
``nccl_env`` as its file writes it (never applied).

A candidate changes one variable of the current setting (the nodes' nccl.conf and
environment, as the inventory's ``nccl_env`` renders them): ``tune_candidates`` maps each
variable to the values to try; by default NCCL's (DEFAULT_NCCL) on GPU nodes, with the
network's across nodes (DEFAULT_NCCL_NET), and a CPU-side knob (DEFAULT_GLOO) on gloo
nodes. Every round runs the current setting and then each candidate once, so a drift of the
machine over the run touches all of them alike; ``tune_repeats`` rounds. A figure's noise is
half the range of its rounds over their median; a candidate wins when its DDP throughput's
median beats the current one by more than the larger of the two noises (the best such
candidate is the winner).
"""

from __future__ import annotations

import difflib
import re
import shutil
import statistics
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.conformance import registry
from gpufleet.conformance.launch import ProbeRun
from gpufleet.conformance.measure.allreduce import port_of, run_allreduce, timeout_of
from gpufleet.conformance.measure.allreduce import probe_args as allreduce_args
from gpufleet.conformance.measure.ddp import result_line, run_job
from gpufleet.conformance.options import ConformanceOptions
from gpufleet.conformance.session import ConformanceSession, Node
from gpufleet.connect.fleet import FleetOptions
from gpufleet.errors import GpufleetError
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host, Inventory
from gpufleet.inventory.target import Target
from gpufleet.inventory.templating import HostVars
from gpufleet.provision.role import RoleVars, Var

DEFAULT_NCCL: dict[str, list[str]] = {"NCCL_ALGO": ["Ring", "Tree"],
                                      "NCCL_PROTO": ["Simple", "LL128"],
                                      "NCCL_BUFFSIZE": ["8388608"]}
DEFAULT_NCCL_NET: dict[str, list[str]] = {"NCCL_NCHANNELS_PER_NET_PEER": ["2"],
                                          "NCCL_IB_QPS_PER_CONNECTION": ["4"]}
DEFAULT_GLOO: dict[str, list[str]] = {"OMP_NUM_THREADS": ["2"]}
VARIABLES = {
    "tune_candidates": Var(None, "mapping", "{VARIABLE: [values]} to try, one at a time"),
    "tune_repeats": Var(5, "integer", "rounds of the current setting and every candidate"),
}
_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*\Z")
_BLOCK = re.compile(r"^nccl_env:\s*(#.*)?$")
_FLOW = re.compile(r"^nccl_env:\s*\{.*\}\s*(#.*)?$")


@dataclass(frozen=True)
class Settings:
    """What the inventory asks of a tuning run (validated before any host is contacted)."""

    candidates: dict[str, list[str]] | None
    repeats: int


def settings(host: Host) -> Settings:
    """The first selected host's tune variables; a VarError names a bad one."""
    v = RoleVars(host, {k: var.default for k, var in VARIABLES.items()})
    repeats = v.integer("tune_repeats")
    if not 2 <= repeats <= 100:
        raise v.fail("tune_repeats", "an integer from 2 to 100", repeats)
    raw = v.get("tune_candidates")
    if raw is None:
        return Settings(None, repeats)
    if not isinstance(raw, Mapping) or not raw:
        raise v.fail("tune_candidates", "a mapping of variables to lists of values", raw)
    candidates: dict[str, list[str]] = {}
    for name, values in raw.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise v.fail("tune_candidates", "environment variable names (A-Z, 0-9, _) as "
                                            "keys", name)
        listed = values if isinstance(values, list) else [values]
        if not listed or any(not isinstance(x, str | int | float) or isinstance(x, bool)
                             or "\n" in str(x) for x in listed):
            raise v.fail("tune_candidates", f"a list of values for {name}", values)
        candidates[name] = [str(x) for x in listed]
    return Settings(candidates, repeats)


@dataclass(frozen=True)
class Candidate:
    """The current setting (no change) or one variable set to one value."""

    change: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.change.items()) or "current"


def candidates(first: Node, wanted: Settings, nodes: int) -> list[Candidate]:
    """Every candidate to try: one variable of ``tune_candidates`` (or the defaults for the
    nodes' backend) at one value, leaving out values the current setting already has."""
    gpus = bool(first.facts and first.facts.get("gpus"))
    table = wanted.candidates or (
        {**DEFAULT_NCCL, **(DEFAULT_NCCL_NET if nodes > 1 else {})} if gpus else DEFAULT_GLOO)
    current = {k: str(v) for k, v in (first.var("nccl_env") or {}).items()}
    return [Candidate({name: value}) for name, values in table.items() for value in values
            if current.get(name) != value]


@dataclass
class Measured:
    """One candidate's rounds: DDP samples/s and AllReduce busbw (GB/s), and failures."""

    candidate: Candidate
    ddp: list[float] = field(default_factory=list)
    busbw: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def median(self, figure: str = "ddp") -> float | None:
        values = self.ddp if figure == "ddp" else self.busbw
        return statistics.median(values) if values else None

    def noise(self, figure: str = "ddp") -> float | None:
        """Half the range of the rounds over their median."""
        values = self.ddp if figure == "ddp" else self.busbw
        middle = self.median(figure)
        if not values or not middle:
            return None
        return (max(values) - min(values)) / 2 / middle

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate.name, "change": self.candidate.change,
                "ddp_samples_per_s": self.ddp, "allreduce_busbw_gbps": self.busbw,
                "ddp_median": self.median(), "ddp_noise": self.noise(),
                "busbw_median": self.median("busbw"), "busbw_noise": self.noise("busbw"),
                "errors": self.errors}


def gain(current: Measured, other: Measured) -> float | None:
    """``other``'s DDP median over the current one's, less one."""
    base, found = current.median(), other.median()
    return None if not base or found is None else found / base - 1


def winner(current: Measured, others: list[Measured]) -> Measured | None:
    """The candidate that beats the current setting by the most, by more than the noise
    of either; None when none does (or one of its rounds failed)."""
    best: tuple[float, Measured] | None = None
    for other in others:
        up = gain(current, other)
        noise = max(current.noise() or 0.0, other.noise() or 0.0)
        if up is None or other.errors or up <= noise:
            continue
        if best is None or up > best[0]:
            best = (up, other)
    return None if best is None else best[1]


def _busbw(run: ProbeRun) -> float | None:
    largest = run.largest
    if run.error() or largest is None or int(largest["world_size"]) < 2:
        return None
    return float(largest["busbw"])


def measure_once(nodes: list[Node], candidate: Candidate) -> tuple[float | None, float | None,
                                                                   list[str]]:
    """One round of one candidate: the DDP job and the AllReduce across ``nodes``."""
    first, errors = nodes[0], []
    job = run_job(nodes, 1, env=candidate.change)
    line = result_line(job)
    if line is None or job.error():
        errors.append(f"DDP: {job.error() or 'no result'}")
    allreduce = run_allreduce(nodes, [*allreduce_args(first), "--trials", "1"],
                              timeout_of(first), port_of(first), env=candidate.change)
    if allreduce.error():
        errors.append(f"AllReduce: {allreduce.error()}")
    return (None if line is None else float(line["samples_per_s"]), _busbw(allreduce), errors)


def tune(nodes: list[Node], wanted: Settings,
         progress: Callable[[int, Candidate], None] | None = None) -> list[Measured]:
    """The current setting first, then every candidate, measured in ``repeats`` rounds."""
    measured = [Measured(c) for c in [Candidate(), *candidates(nodes[0], wanted, len(nodes))]]
    for round_no in range(1, wanted.repeats + 1):
        for entry in measured:
            if progress:
                progress(round_no, entry.candidate)
            ddp, busbw, errors = measure_once(nodes, entry.candidate)
            if ddp is not None:
                entry.ddp.append(ddp)
            if busbw is not None:
                entry.busbw.append(busbw)
            entry.errors += [f"round {round_no}: {e}" for e in errors]
    return measured


def _figure(entry: Measured, figure: str) -> str:
    middle, noise = entry.median(figure), entry.noise(figure)
    if middle is None:
        return "-"
    digits = 0 if middle >= 100 else 3
    return f"{middle:,.{digits}f} ±{(noise or 0):.1%}"


def table(measured: list[Measured], best: Measured | None) -> str:
    """The tuning table: every candidate's medians and noise, and its gain."""
    rows = [("candidate", "DDP samples/s", "vs current", "AllReduce busbw GB/s", "")]
    current = measured[0]
    for entry in measured:
        up = gain(current, entry) if entry is not current else None
        note = "winner" if entry is best else (f"failed: {entry.errors[0]}" if entry.errors
                                               else "")
        rows.append((entry.candidate.name, _figure(entry, "ddp"),
                     "" if up is None else f"{up:+.1%}", _figure(entry, "busbw"), note))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True))
                     .rstrip() + (f"  {r[4]}" if r[4] else "") for r in rows)


def group_file(inventory: Path, group: str) -> Path:
    """The group's variables file: ``group_vars/GROUP.yml`` (or ``.yaml``) beside the
    inventory's hosts."""
    base = inventory if inventory.is_dir() else inventory.parent
    for suffix in (".yml", ".yaml"):
        found = base / "group_vars" / f"{group}{suffix}"
        if found.is_file():
            return found
    if (base / "group_vars" / group).is_dir():
        raise GpufleetError(f"group_vars/{group}/ is a directory: put nccl_env in one of its "
                            "files by hand (the winner is in the table)")
    return base / "group_vars" / f"{group}.yml"


def _scalar(value: str) -> str:
    """``value`` as one YAML scalar, quoted where YAML would read it as something else."""
    return str(yaml.safe_dump([value], default_flow_style=True, width=10**6)).strip()[1:-1]


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" \t"))]


def _one_line_scalar(text: str) -> bool:
    """Whether ``text`` is a whole YAML scalar (no block scalar, alias, tag or collection)."""
    if not text.strip() or text.strip()[0] in "|>&*!":
        return False
    try:
        return not isinstance(yaml.safe_load(text), dict | list)
    except yaml.YAMLError:
        return False


def _set_in_block(lines: list[str], start: int, key: str, value: str) -> list[str] | None:
    """The block mapping under ``lines[start]`` with ``key`` set: the value of its line
    replaced (indentation and comment kept), or a line added after the last entry; None
    when the key's value is not a one-line scalar."""
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t#"):
        end += 1
    entries = [i for i in range(start + 1, end)
               if lines[i].strip() and not lines[i].lstrip().startswith("#")]
    indent = _indent(lines[entries[0]]) if entries else "  "
    entry = re.compile(rf"^(?P<head>{re.escape(indent)}(?P<q>[\"']?){re.escape(key)}(?P=q)"
                       r"\s*:)(?P<value>\s*(?:\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\n]|'')*'|[^#\n]*?))"
                       r"(?P<tail>\s+#[^\n]*)?\s*\n?$")
    for number, i in enumerate(entries):
        found = entry.match(lines[i])
        if found is None:
            continue
        following = entries[number + 1] if number + 1 < len(entries) else None
        if not _one_line_scalar(found["value"]) or (
                following is not None and _indent(lines[following]) != indent):
            return None
        return [*lines[:i], f"{found['head']} {_scalar(value)}{found['tail'] or ''}\n",
                *lines[i + 1:]]
    last = entries[-1] if entries else start
    tail = lines[last] if lines[last].endswith("\n") else lines[last] + "\n"
    return [*lines[:last], tail, f"{indent}{key}: {_scalar(value)}\n", *lines[last + 1:]]


def _set_in_flow(line: str, key: str, value: str) -> str | None:
    """A one-line ``nccl_env: {...}`` with ``key`` set; None when it is not a mapping of
    scalars."""
    comment = re.search(r"\}(\s+#.*)$", line.rstrip("\n"))
    try:
        parsed = yaml.safe_load(line)
    except yaml.YAMLError:
        return None
    env = parsed.get("nccl_env") if isinstance(parsed, dict) else None
    if not isinstance(env, dict) or any(isinstance(v, dict | list) for v in env.values()):
        return None
    env[key] = value
    flow = str(yaml.safe_dump(env, default_flow_style=True, sort_keys=False,
                              width=10**6)).strip()
    return f"nccl_env: {flow}{comment.group(1) if comment else ''}\n"


def with_change(text: str, key: str, value: str) -> str | None:
    """``text`` (a group's YAML file) with ``key`` set in its own ``nccl_env``, every other
    line as written (templates unrendered); None when the file has no top-level
    ``nccl_env`` whose entries are one-line scalars."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if _FLOW.match(line):
            flow = _set_in_flow(line, key, value)
            return None if flow is None else "".join([*lines[:i], flow, *lines[i + 1:]])
        if _BLOCK.match(line):
            block = _set_in_block(lines, i, key, value)
            return None if block is None else "".join(block)
    return None


def own_value(text: str) -> Any:
    """The file's own top-level ``nccl_env`` as written (None without one)."""
    try:
        data = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        return None
    return data.get("nccl_env") if isinstance(data, dict) else None


@dataclass(frozen=True)
class Proposal:
    """The winner as a diff of the group's file (empty when none can be written), and what
    the reader must know before applying it."""

    patch: str
    notes: list[str]


def propose(inventory: Inventory, group: str, hosts: list[Host], key: str, value: str
            ) -> Proposal:
    """The diff that sets ``key`` to ``value`` in the group's own ``nccl_env``, as its file
    writes it: one line changes (or one is added), templates and every other entry stay as
    written. Where the file has no ``nccl_env`` the diff adds one, copied as written from
    where the nodes get theirs now, and says so; a selected host that would not see the
    change (its own ``nccl_env``, or a group that outranks this one) is named."""
    path = group_file(inventory.base, group)
    relative = str(path.relative_to(inventory.base))
    old = path.read_text() if path.is_file() else ""
    notes: list[str] = []
    new = with_change(old, key, value)
    if new is None and own_value(old) is not None:
        return Proposal("", [f"{relative} sets nccl_env in a form the diff does not edit "
                             f"(a template or a multi-line value): set {key}: "
                             f"{_scalar(value)} there by hand"])
    if new is None:
        inline = inventory.group_vars(group).get("nccl_env")
        inherited = _inherited(inventory, group, hosts[0])
        if inline is not None:
            base, where = inline, f"group {group}'s nccl_env is set in the inventory file"
        elif inherited is not None:
            base = inventory.group_vars(inherited)["nccl_env"]
            where = f"group {group} has no nccl_env of its own: it inherits group {inherited}'s"
        else:
            base, where = {}, "no group or host defines nccl_env"
        if not isinstance(base, Mapping):
            return Proposal("", [f"{where}, not as a mapping: set {key}: {_scalar(value)} "
                                 "there by hand"])
        block = yaml.safe_dump({"nccl_env": {**base, key: value}}, default_flow_style=False,
                               sort_keys=False)
        spacer = "" if not old or old.endswith("\n\n") else ("\n" if old.endswith("\n")
                                                               else "\n\n")
        new = old + spacer + block
        notes.append(f"{where}; the diff gives group {group} its own in {relative}"
                     + (", a copy of that one as written with the change" if base else
                        " with the change only"))
    for host in _unreached(inventory, (path, new), hosts, key, value):
        notes.append(f"{host.name} takes its nccl_env from "
                     f"{_place(host.origin('nccl_env'), inventory.base)}, which this diff "
                     f"does not change: it keeps {key} as it is")
    patch = "".join(difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"a/{relative}" if old else "/dev/null", tofile=f"b/{relative}"))
    return Proposal(patch, notes)


def _place(origin: str | None, base: Path) -> str:
    """An origin (``file:line``) relative to the inventory's directory."""
    if origin is None:
        return "nowhere"
    file, colon, line = origin.rpartition(":")
    if not colon or not line.isdigit():
        file, line = origin, ""
    try:
        name = str(Path(file).relative_to(base))
    except ValueError:
        name = file
    return f"{name}:{line}" if line else name


def _inherited(inventory: Inventory, group: str, host: Host) -> str | None:
    """The group whose ``nccl_env`` ``host`` has from its groups (its own set aside): of its
    groups that write one, the one whose value it has, else the deepest, as Ansible orders
    them."""
    writing = [g for g in host.groups
               if g != group and inventory.group_vars(g).get("nccl_env") is not None]
    if not writing:
        return None
    depth: dict[str, int] = {"all": 0}
    level = ["all"]
    while level:  # longest chain from all, level by level (a cycle is refused on load)
        following = []
        for name in level:
            for child in inventory.children(name):
                if depth.get(child, -1) < depth[name] + 1:
                    depth[child] = depth[name] + 1
                    following.append(child)
        level = following
    same = [g for g in writing if inventory.group_vars(g)["nccl_env"] == _written(host)]
    return max(same or writing, key=lambda g: (depth.get(g, 0), g))


def _written(host: Host) -> Any:
    """The host's ``nccl_env`` as the inventory writes it, templates unrendered."""
    return host.vars.raw().get("nccl_env") if isinstance(host.vars, HostVars) else \
        host.vars.get("nccl_env")


def _unreached(inventory: Inventory, written: tuple[Path, str], hosts: list[Host], key: str,
               value: str) -> list[Host]:
    """The hosts that would not get ``key: value`` with the file ``written[0]`` as
    ``written[1]``: the
    inventory's files are copied and loaded again, so Ansible's precedence decides, as it
    will when the diff is applied."""
    base = inventory.base
    with tempfile.TemporaryDirectory(prefix="gpufleet-tune-") as scratch:
        root = Path(scratch)
        for source in inventory.sources:
            if source.is_relative_to(base):
                copy = root / source.relative_to(base)
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, copy)
        changed = root / written[0].relative_to(base)
        changed.parent.mkdir(parents=True, exist_ok=True)
        changed.write_text(written[1])
        loaded = load_inventory(root / inventory.path.relative_to(base)
                                if inventory.path != base else root)
    missed = []
    for host in hosts:
        env = _written(loaded.hosts[host.name])
        if not isinstance(env, Mapping) or str(env.get(key)) != value:
            missed.append(host)
    return missed


def target_group(target: Target, group: str | None) -> str:
    """The group whose ``nccl_env`` the winner goes to: ``group`` (it must hold every
    selected host), else the smallest group but ``all`` that does, else ``all``."""
    inventory, selected = target.inventory, {h.name for h in target.hosts}
    if group is not None:
        if group not in inventory.groups:
            raise GpufleetError(f"--group {group!r}: no such group in {inventory.path}")
        if not selected <= inventory.groups[group]:
            missing = sorted(selected - inventory.groups[group])
            raise GpufleetError(f"--group {group!r} does not hold every selected host "
                                f"({', '.join(missing[:5])} not in it)")
        return group
    holding = sorted((len(members), name) for name, members in inventory.groups.items()
                     if name not in ("all", "ungrouped") and selected <= members)
    return holding[0][1] if holding else "all"


@dataclass(frozen=True)
class Plan:
    """A tune run's input, checked before any host is contacted: what the nodes are asked
    to try, and the group (and its file) the winner goes to."""

    wanted: Settings
    group: str
    path: Path


def plan(target: Target, group: str | None) -> Plan:
    """The run's settings and group; the allreduce and ddp variables of every selected host
    are checked (the probes read them)."""
    wanted = settings(target.hosts[0])
    registry.validate(target.hosts, [registry.suite("allreduce"), registry.suite("ddp")])
    chosen = target_group(target, group)
    return Plan(wanted, chosen, group_file(target.inventory.base, chosen))


@dataclass
class TuneRun:
    """What a tune run measured: the current setting first, then each candidate; the
    winner (None: none beats the noise) and its proposal; the nodes that could not be
    reached, with why."""

    unreachable: dict[str, str]
    measured: list[Measured] = field(default_factory=list)
    best: Measured | None = None
    proposal: Proposal | None = None


def run(target: Target, chosen: Plan, fleet: FleetOptions, *,
        started: Callable[[int, dict[str, str]], None],
        progress: Callable[[int, Candidate], None] | None = None) -> TuneRun:
    """Reach the selected nodes, tell ``started`` how many are ready and why the others are
    not, and measure every candidate on the ready ones (nothing when none is)."""
    session = ConformanceSession.start(target.inventory, target.hosts,
                                       ConformanceOptions(fleet=fleet))
    try:
        unreachable = {n.name: str(n.error) for n in session.nodes.values() if n.facts is None}
        nodes = session.ready()
        started(len(nodes), unreachable)
        result = TuneRun(unreachable)
        if not nodes:
            return result
        result.measured = tune(nodes, chosen.wanted, progress=progress)
        result.best = winner(result.measured[0], result.measured[1:])
        if result.best is not None:
            (key, value), = result.best.candidate.change.items()
            result.proposal = propose(target.inventory, chosen.group,
                                      [n.host for n in nodes], key, value)
        return result
    finally:
        session.close()
