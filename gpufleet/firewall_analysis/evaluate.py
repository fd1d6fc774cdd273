"""Whole-range evaluation of rulesets on intervals, not port by port.

The requested ports are split at every port boundary a rule mentions, and the sources at
every address boundary; source pieces that fall on the same side of every address test
form one group. Each (group, port piece) is a packet class that every rule treats alike.
Classes are the bits of Python integers, so one pass over the rules evaluates them all.

A point of the evaluation is reached by a class *surely* (on every path) or *maybe* (on
some paths, after a rule that may or may not apply). Accept ends only the base chain it
happens in; drop and reject are final. A class no drop or reject can reach is accepted;
one that every path drops or rejects is dropped or rejected; the rest are uncertain.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gpufleet.errors import GpufleetError, ParseError
from gpufleet.firewall_analysis.findings import Analysis, Cause, Finding, Located, Outcome
from gpufleet.firewall_analysis.model import (
    CONTINUE,
    FAMILIES,
    HOOK_ORDER,
    Action,
    Addrs,
    Chain,
    Cond,
    Family,
    Hook,
    Iface,
    Intervals,
    Jump,
    OnlyFamily,
    Pairs,
    Ports,
    Rule,
    RuleRef,
    Ruleset,
    Table,
    Unsure,
    Verdict,
    VerdictMap,
    address_span,
    address_text,
)

MAX_DEPTH = 64
"""Deepest chain nesting followed (nft itself refuses more than 16 jumps deep)."""


class Flow(NamedTuple):
    """The classes that reach a point surely and maybe (disjoint bit masks)."""

    sure: int = 0
    maybe: int = 0

    def join(self, other: Flow) -> Flow:
        """Either way in: a class sure on one way cannot reach the other at all."""
        sure = self.sure | other.sure
        return Flow(sure, (self.maybe | other.maybe) & ~sure)

    def any(self) -> bool:
        return bool(self.sure | self.maybe)


NOTHING = Flow()


class Masks(NamedTuple):
    """For a rule: classes it surely matches, classes it may match, and why it may."""

    true: int
    possible: int
    reason: str | None


class _Place(NamedTuple):
    table: Table
    chain: Chain
    depth: int


@dataclass(frozen=True)
class _Source:
    text: str
    family: Family
    lo: int
    hi: int


@dataclass
class _Group:
    family: Family
    probe: int
    members: list[tuple[int, int, int]] = field(default_factory=list)


def _all_conds(rule: Rule) -> Iterator[Cond]:
    yield from rule.conds
    if isinstance(rule.action, VerdictMap):
        for conds, _ in rule.action.entries:
            yield from conds


def _split(spans: Sequence[tuple[int, int]], cuts: list[int]) -> list[tuple[int, int]]:
    """``spans`` cut before every value of ``cuts`` (sorted) that falls inside one."""
    pieces = []
    for lo, hi in spans:
        start = lo
        i = bisect.bisect_right(cuts, lo)
        while i < len(cuts) and cuts[i] <= hi:
            pieces.append((start, cuts[i] - 1))
            start = cuts[i]
            i += 1
        pieces.append((start, hi))
    return pieces


class _Space:
    """The packet classes and the bit masks of conditions over them."""

    def __init__(self, rules: list[Rule], sources: list[_Source], ports: Intervals) -> None:
        port_cuts: set[int] = set()
        tests: dict[Family, dict[Intervals, None]] = {f: {} for f in FAMILIES}
        for cond in (c for rule in rules for c in _all_conds(rule)):
            if isinstance(cond, Ports):
                port_cuts.update(cond.values.bounds())
            elif isinstance(cond, Addrs):
                tests[cond.family][cond.values] = None
            elif isinstance(cond, Pairs):
                for addrs, ports_of in cond.pairs:
                    tests[cond.family][addrs] = None
                    port_cuts.update(ports_of.bounds())
        self.sources = sources
        self.pieces = _split(ports.spans, sorted(port_cuts))
        self.groups = [g for family in FAMILIES
                       for g in _groups(sources, family, list(tests[family]))]
        width = self.width = len(self.pieces)
        self.full = (1 << (width * len(self.groups))) - 1
        self.repeat = sum(1 << (g * width) for g in range(len(self.groups)))
        self.blocks = [((1 << width) - 1) << (g * width) for g in range(len(self.groups))]
        self.family_mask = {f: sum(b for b, g in zip(self.blocks, self.groups, strict=True)
                                   if g.family == f) for f in FAMILIES}

    def port_mask(self, values: Intervals) -> int:
        return sum(1 << p for p, (lo, _) in enumerate(self.pieces) if lo in values) * self.repeat

    def addr_mask(self, family: Family, values: Intervals) -> int:
        return sum(b for b, g in zip(self.blocks, self.groups, strict=True)
                   if g.family == family and g.probe in values)


def _groups(sources: list[_Source], family: Family, tests: list[Intervals]) -> list[_Group]:
    """Pieces of the sources of ``family`` grouped by which address tests hold for them."""
    cuts = sorted({b for test in tests for b in test.bounds()})
    by_signature: dict[tuple[bool, ...], _Group] = {}
    for index, source in enumerate(sources):
        if source.family != family:
            continue
        for lo, hi in _split([(source.lo, source.hi)], cuts):
            signature = tuple(lo in test for test in tests)
            group = by_signature.setdefault(signature, _Group(family, lo))
            group.members.append((index, lo, hi))
    return list(by_signature.values())


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


_Key = tuple[Outcome, Located | None, Cause | None]


@dataclass(frozen=True)
class _End:
    at: Located
    verdict: Outcome


class _Run:
    """One evaluation of all base chains over all classes."""

    def __init__(self, space: _Space, iif: str | None) -> None:
        self.space = space
        self.iif = iif
        self.no_end = self.no_sure = self.no_cause = space.full
        self.first_end: dict[int, _End] = {}
        self.first_sure: dict[int, _End] = {}
        self.causes: dict[int, Cause] = {}
        self.masks: dict[int, Masks] = {}
        self.passed = NOTHING
        self.base: Chain | None = None

    def run(self, bases: list[tuple[Table, Chain]]) -> Flow:
        """The classes that every base chain accepts, surely and maybe."""
        flow = Flow(self.space.full, 0)
        for table, chain in bases:
            assert chain.hook is not None
            applies = self._applies(chain.hook)
            if applies is False:
                continue
            fam = sum(self.space.family_mask[f] for f in table.families)
            entry = Flow(flow.sure & fam, flow.maybe & fam)
            passed = self._base(table, chain, chain.hook, entry)
            if isinstance(applies, tuple):
                ref = RuleRef(table.label, chain.name, applies[0])
                self._note(entry.sure & ~passed.sure,
                           Cause(self._located(table, chain, ref), applies[1]))
                passed = Flow(passed.sure, (entry.sure | entry.maybe) & ~passed.sure)
            flow = Flow(flow.sure & ~fam, flow.maybe & ~fam).join(passed)
        return flow

    def _base(self, table: Table, chain: Chain, hook: Hook, entry: Flow) -> Flow:
        """Run one base chain: the classes it accepts (by a rule or by its policy)."""
        self.passed = NOTHING
        self.base = chain
        out = self._chain(_Place(table, chain, 0), entry)
        if hook.policy == "accept":
            self.passed = self.passed.join(out)
        else:
            ref = RuleRef(table.label, chain.name, f"policy {hook.policy}")
            self._end(out.sure | out.maybe, self.space.full, self._located(table, chain, ref),
                      "dropped")
        return self.passed

    def _applies(self, hook: Hook) -> bool | tuple[str, str]:
        """Whether a base chain sees cluster traffic; (text, why) when that is not known."""
        if hook.name != "ingress":
            return True
        if not hook.device_known:
            return ("device not shown by nft -j",
                    "the chain sees only packets that arrive on its device")
        if self.iif is None:
            if all(device == "lo" for device in hook.device):
                return False
            return (f"device {', '.join(hook.device)}", "depends on the input interface")
        return self.iif in hook.device

    def _chain(self, place: _Place, flow: Flow) -> Flow:
        """Run a chain: the classes that come back from it (by return, or at its end)."""
        if place.depth > MAX_DEPTH:
            raise ParseError(f"{place.table.label} chain {place.chain.name}: chains nest "
                             f"deeper than {MAX_DEPTH}")
        back = NOTHING
        for rule in place.chain.rules:
            if not flow.any():
                break
            flow, returned = self._step(place, rule, rule.action, self._rule_masks(rule), flow)
            back = back.join(returned)
        return back.join(flow)

    def _step(self, place: _Place, rule: Rule, action: Action, masks: Masks,
              flow: Flow) -> tuple[Flow, Flow]:
        """One rule: the classes after it, and those it returns to the calling chain."""
        if isinstance(action, VerdictMap):
            back = NOTHING
            for conds, entry in action.entries:
                em = self._cond_masks(conds)
                both = Masks(masks.true & em.true, masks.possible & em.possible,
                             masks.reason or em.reason)
                flow, returned = self._step(place, rule, entry, both, flow)
                back = back.join(returned)
            return flow, back
        t, n = masks.true, masks.possible
        newly = flow.sure & n & ~t
        hit = Flow(flow.sure & t, newly | (flow.maybe & n))
        if not hit.any() or action == CONTINUE:
            return flow, NOTHING
        at = self._located(place.table, place.chain, rule.ref)
        if newly and masks.reason:
            self._note(newly, Cause(at, masks.reason))
        after = Flow(flow.sure & ~n, (flow.maybe & ~t) | newly)
        if isinstance(action, Jump):
            target = place.table.chains[action.target]
            back = self._chain(_Place(place.table, target, place.depth + 1), hit)
            return (after, back) if action.goto else (after.join(back), NOTHING)
        if isinstance(action, Verdict):
            return self._verdict(action, at, hit, after, t)
        self._note(hit.sure, Cause(at, action.reason))
        self._end(hit.sure | hit.maybe, 0, at, "uncertain")
        self.passed = self.passed.join(Flow(0, hit.sure | hit.maybe))
        return Flow(after.sure, after.maybe | hit.sure | hit.maybe), NOTHING

    def _verdict(self, action: Verdict, at: Located, hit: Flow, after: Flow,
                 true: int) -> tuple[Flow, Flow]:
        if action.kind == "accept":
            self.passed = self.passed.join(hit)
        elif action.kind in ("drop", "reject"):
            outcome: Outcome = "dropped" if action.kind == "drop" else "rejected"
            self._end(hit.sure | hit.maybe, true, at, outcome)
        elif action.kind == "return":
            return after, hit
        return after, NOTHING

    def _rule_masks(self, rule: Rule) -> Masks:
        key = id(rule)
        if key not in self.masks:
            self.masks[key] = self._cond_masks(rule.conds)
        return self.masks[key]

    def _cond_masks(self, conds: Sequence[Cond]) -> Masks:
        full = self.space.full
        true, possible, reason = full, full, None
        for cond in conds:
            t, n, why = self._cond(cond)
            true &= t
            possible &= n
            reason = reason or why
        return Masks(true, possible, reason)

    def _cond(self, cond: Cond) -> Masks:
        full = self.space.full
        exact = self._exact(cond)
        if exact is not None:
            return Masks(exact, exact, None)
        if isinstance(cond, Iface):
            holds = self._iface(cond)
            if isinstance(holds, str):
                return Masks(0, full, holds)
            return Masks(full, full, None) if holds else Masks(0, 0, None)
        if isinstance(cond, Unsure):
            return Masks(0, full, cond.reason)
        return Masks(0, 0, None)

    def _exact(self, cond: Cond) -> int | None:
        """The classes a condition on ports, addresses or the family holds for."""
        space = self.space
        if isinstance(cond, Ports):
            mask = space.port_mask(cond.values)
            return space.full & ~mask if cond.negate else mask
        if isinstance(cond, Addrs | Pairs):
            if isinstance(cond, Addrs):
                inside = space.addr_mask(cond.family, cond.values)
            else:
                inside = 0
                for addrs, ports in cond.pairs:
                    inside |= space.addr_mask(cond.family, addrs) & space.port_mask(ports)
            return space.family_mask[cond.family] & ~inside if cond.negate else inside
        if isinstance(cond, OnlyFamily):
            return space.family_mask[cond.family]
        return None

    def _iface(self, cond: Iface) -> bool | str:
        """Whether the input interface matches; unknown interface: ``lo`` never does."""
        if self.iif is None:
            if all(name == "lo" for name in cond.names):
                return cond.negate
            return f"depends on the input interface: {cond.text}"
        iif = self.iif
        hit = any(name == iif or (name.endswith("*") and iif.startswith(name[:-1]))
                  for name in cond.names)
        return hit != cond.negate

    def _located(self, table: Table, chain: Chain, ref: RuleRef) -> Located:
        base = self.base
        assert base is not None and base.hook is not None
        hook = base.hook
        where = (f"priority {hook.priority}" if hook.name == "input"
                 else f"hook {hook.name}, priority {hook.priority}")
        if chain is not base:
            where = f"reached from chain {base.name}, {where}"
        return Located(ref, where)

    def _end(self, mask: int, true: int, at: Located, verdict: Outcome) -> None:
        """Record where classes of ``mask`` may end; ``true``: those the rule surely matches."""
        end = _End(at, verdict)
        new = mask & self.no_end
        for i in _bits(new):
            self.first_end[i] = end
        self.no_end &= ~new
        new_sure = mask & true & self.no_sure
        for i in _bits(new_sure):
            self.first_sure[i] = end
        self.no_sure &= ~new_sure

    def _note(self, mask: int, cause: Cause) -> None:
        new = mask & self.no_cause
        for i in _bits(new):
            self.causes[i] = cause
        self.no_cause &= ~new

    def outcome(self, i: int, accepted: Flow) -> _Key:
        end = self.first_end.get(i)
        if end is None or accepted.sure >> i & 1:
            return "accepted", None, None
        if accepted.maybe >> i & 1:
            return "uncertain", end.at, self.causes.get(i)
        end = self.first_sure.get(i, end)
        return end.verdict, end.at, self.causes.get(i) if end.verdict == "uncertain" else None


def _parse_sources(sources: Sequence[str]) -> list[_Source]:
    parsed = []
    for text in sources:
        try:
            family, lo, hi = address_span(str(text))
        except ParseError:
            raise GpufleetError(f"firewall analysis: source {text!r} is not an IP address or "
                                "network") from None
        parsed.append(_Source(str(text).strip(), family, lo, hi))
    return parsed


def _parse_ports(ports: Sequence[tuple[int, int]]) -> Intervals:
    for lo, hi in ports:
        if not 1 <= lo <= hi <= 65535:
            raise GpufleetError(f"firewall analysis: port range {lo}-{hi} is not within "
                                "1-65535")
    return Intervals.of(ports)


def _base_order(base: tuple[Table, Chain]) -> tuple[int, int]:
    hook = base[1].hook
    assert hook is not None
    return HOOK_ORDER[hook.name], hook.priority


def analyse(rulesets: Sequence[Ruleset], sources: Sequence[str],
            ports: Sequence[tuple[int, int]], *, iif: str | None = None) -> Analysis:
    """What the rulesets together do to new TCP connections from each source to each port.

    Base chains of all rulesets run in hook, then priority order (ties in the order
    given). ``iif`` is the interface cluster traffic arrives on (None: not known).
    """
    parsed = _parse_sources(sources)
    wanted = _parse_ports(ports)
    covered = {f for ruleset in rulesets for f in ruleset.families}
    for family in FAMILIES:
        missing = [s.text for s in parsed if s.family == family and family not in covered]
        if missing:
            raise GpufleetError(f"firewall analysis: no {family} ruleset was given for the "
                                f"{family} sources ({', '.join(missing[:3])})")
    notes = tuple(note for ruleset in rulesets for note in ruleset.notes)
    if not parsed or not wanted.spans:
        return Analysis((), notes)
    tables = [t for ruleset in rulesets for t in ruleset.tables]
    bases = sorted(((t, c) for t in tables for c in t.chains.values() if c.hook is not None),
                   key=_base_order)
    space = _Space([r for t in tables for c in t.chains.values() for r in c.rules], parsed,
                   wanted)
    run = _Run(space, iif)
    return Analysis(_findings(space, run, run.run(bases)), notes)


def _findings(space: _Space, run: _Run, accepted: Flow) -> tuple[Finding, ...]:
    """Adjacent port pieces of a group with the same outcome merged, then the groups with
    the same outcome for the same ports."""
    buckets: dict[tuple[int, int, _Key], list[int]] = {}
    for g in range(len(space.groups)):
        runs: list[tuple[int, int, _Key]] = []
        for p, (lo, hi) in enumerate(space.pieces):
            key = run.outcome(g * space.width + p, accepted)
            if runs and runs[-1][2] == key and runs[-1][1] == lo - 1:
                runs[-1] = (runs[-1][0], hi, key)
            else:
                runs.append((lo, hi, key))
        for lo, hi, key in runs:
            buckets.setdefault((lo, hi, key), []).append(g)
    findings = [Finding(verdict, _source_texts(space, groups), (lo, hi), rule, cause)
                for (lo, hi, (verdict, rule, cause)), groups in buckets.items()]
    order = {"dropped": 0, "rejected": 1, "uncertain": 2, "accepted": 3}
    findings.sort(key=lambda f: (f.ports, order[f.verdict], f.sources))
    return tuple(findings)


def _source_texts(space: _Space, groups: list[int]) -> tuple[str, ...]:
    """The sources of the groups; a source only partly in them as its parts ``(of ...)``."""
    parts: dict[int, list[tuple[int, int]]] = {}
    for g in groups:
        for index, lo, hi in space.groups[g].members:
            parts.setdefault(index, []).append((lo, hi))
    texts: list[str] = []
    for index in sorted(parts):
        source = space.sources[index]
        spans = Intervals.of(parts[index]).spans
        if spans == ((source.lo, source.hi),):
            texts.append(source.text)
        else:
            texts += [f"{address_text(source.family, lo, hi)} (of {source.text})"
                      for lo, hi in spans]
    return tuple(texts)
