"""``gpufleet tune``: the DDP probe and the AllReduce probe across the selected nodes under
the current environment and under each candidate, in rounds, and a winner only where it
beats the current setting by more than the noise, written as a diff of the group's
``nccl_env`` (never applied).

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
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.conformance.allreduce import port_of, run_allreduce, timeout_of
from gpufleet.conformance.allreduce import probe_args as allreduce_args
from gpufleet.conformance.ddp_job import result_line, run_job
from gpufleet.conformance.launch import ProbeRun
from gpufleet.conformance.session import Node
from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host
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


def with_nccl_env(text: str, env: Mapping[str, Any]) -> str:
    """``text`` (a group's YAML) with its ``nccl_env`` replaced by ``env`` (added at the end
    when it has none); every other line is kept."""
    block = yaml.safe_dump({"nccl_env": dict(env)}, default_flow_style=False, sort_keys=False)
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if _FLOW.match(line):
            return "".join([*lines[:i], block, *lines[i + 1:]])
        if _BLOCK.match(line):
            end = i + 1
            while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t#"):
                end += 1
            while end > i + 1 and not lines[end - 1].strip():
                end -= 1
            return "".join([*lines[:i], block, *lines[end:]])
    spacer = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n")
                                                            else "\n\n")
    return text + spacer + block


def diff(path: Path, relative: str, env: Mapping[str, Any]) -> str:
    """The unified diff that sets the group's ``nccl_env`` to ``env``."""
    old = path.read_text() if path.is_file() else ""
    new = with_nccl_env(old, env)
    return "".join(difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"a/{relative}" if old else "/dev/null", tofile=f"b/{relative}"))
