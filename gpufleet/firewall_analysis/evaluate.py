"""Whole-range evaluation of rulesets on intervals, not port by port.

The requested ports are split at every port boundary a rule mentions, and the sources at
every address boundary; source pieces that fall on the same side of every address test
form one group. Each (group, port piece) is a packet class that every rule treats alike.
Classes are the bits of Python integers, so one pass over the rules evaluates them all.

A point of the evaluation is reached by a class *surely* (on every path) or *maybe* (on
some paths, after a rule that may or may not apply). Accept ends only the base chain it
happens in; drop and reject are final. A class no drop or reject can reach is accepted;
one that every path drops or rejects is dropped or rejected; the rest are uncertain.

Base chains run in hook order (ingress, prerouting, input), then by priority; of equal
priority, the one registered last runs first (the kernel inserts a new hook before those
of its priority), taken to be the one listed last. conntrack runs in prerouting at
priority -200: before it (ingress, prerouting below -200, iptables' raw table) a packet
has no conntrack entry, so ``ct state`` reads ``invalid``; a ``notrack`` there makes it
``untracked`` for good; after it the SYN is ``new``. A chain at exactly -200 may run on
either side (whichever hook was registered last runs first), so conntrack tests there
are uncertain.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gpufleet.errors import GpufleetError, ParseError
from gpufleet.firewall_analysis.findings import Analysis, Cause, Finding, Located, Outcome
from gpufleet.firewall_analysis.model import (
    CONNTRACK_PRIORITY,
    CONTINUE,
    FAMILIES,
    HOOK_ORDER,
    Action,
    Addrs,
    Chain,
    Cond,
    CtState,
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
    Tracked,
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


class Phase(NamedTuple):
    """Where a base chain runs against conntrack: the states a packet without notrack can
    have there (``invalid`` before conntrack, ``new`` after, both at its priority)."""

    states: tuple[str, ...]
    why: str


BEFORE = Phase(("invalid",), "")
AFTER = Phase(("new",), "")
AT_CONNTRACK = Phase(("invalid", "new"), "the chain runs at conntrack's priority -200, "
                                          "before or after it")


def phase(hook: Hook) -> Phase:
    """Whether a base chain runs before conntrack, after it, or may run on either side."""
    if hook.name == "ingress" or (hook.name == "prerouting"
                                  and hook.priority < CONNTRACK_PRIORITY):
        return BEFORE
    if hook.name == "prerouting" and hook.priority == CONNTRACK_PRIORITY:
        return AT_CONNTRACK
    return AFTER


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
    """The packet classes and the bit masks of conditions over them.

    Class ``g * width + p`` is group ``g`` on port piece ``p``. Groups are ordered by
    family and address, so a test's address span covers a run of groups, and a port span
    a run of pieces: every mask is built from a few shifted runs of ones.
    """

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
        self.piece_starts = [lo for lo, _ in self.pieces]
        # pieces that start a requested port range, other than the first
        self.range_starts = [p for p in range(1, len(self.pieces))
                             if self.pieces[p][0] != self.pieces[p - 1][1] + 1]
        self.groups = [g for family in FAMILIES
                       for g in _groups(sources, family, list(tests[family]))]
        width = self.width = len(self.pieces)
        self.full = (1 << (width * len(self.groups))) - 1
        self.probes = {f: [g.probe for g in self.groups if g.family == f] for f in FAMILIES}
        self.first_group = {f: next((i for i, g in enumerate(self.groups) if g.family == f), 0)
                            for f in FAMILIES}
        self.family_mask = {f: self._group_run(self.first_group[f], len(self.probes[f]))
                            for f in FAMILIES}
        self._port_masks: dict[tuple[tuple[int, int], ...], int] = {}

    def _group_run(self, first: int, count: int) -> int:
        return ((1 << (count * self.width)) - 1) << (first * self.width)

    def port_mask(self, values: Intervals) -> int:
        """The classes whose port piece lies in ``values``, for every group."""
        if values.spans not in self._port_masks:
            bits = 0
            for lo, hi in values.spans:
                a = bisect.bisect_left(self.piece_starts, lo)
                b = bisect.bisect_right(self.piece_starts, hi)
                bits |= ((1 << (b - a)) - 1) << a
            self._port_masks[values.spans] = self._replicate(bits)
        return self._port_masks[values.spans]

    def _replicate(self, bits: int) -> int:
        """``bits`` (one group's pieces) copied into every group's block, by doubling."""
        out, copies, count = bits, 1, len(self.groups)
        while copies < count:
            more = min(copies, count - copies)
            out |= (out & ((1 << (more * self.width)) - 1)) << (copies * self.width)
            copies += more
        return out if count else 0

    def addr_mask(self, family: Family, values: Intervals) -> int:
        """The classes whose source group lies in ``values``, on every port piece."""
        probes, first, bits = self.probes[family], self.first_group[family], 0
        for lo, hi in values.spans:
            a, b = bisect.bisect_left(probes, lo), bisect.bisect_right(probes, hi)
            bits |= self._group_run(first + a, b - a)
        return bits


def _groups(sources: list[_Source], family: Family, tests: list[Intervals]) -> list[_Group]:
    """Pieces of the sources of ``family`` grouped by which address tests hold for them."""
    cuts = sorted({b for test in tests for b in test.bounds()})
    pieces = sorted((lo, hi, index) for index, source in enumerate(sources)
                    if source.family == family
                    for lo, hi in _split([(source.lo, source.hi)], cuts))
    starts = [lo for lo, _, _ in pieces]
    holds: list[list[int]] = [[] for _ in pieces]
    for t, test in enumerate(tests):
        for lo, hi in test.spans:
            for k in range(bisect.bisect_left(starts, lo), bisect.bisect_right(starts, hi)):
                holds[k].append(t)
    by_signature: dict[tuple[int, ...], _Group] = {}
    for (lo, hi, index), signature in zip(pieces, holds, strict=True):
        group = by_signature.setdefault(tuple(signature), _Group(family, lo))
        group.members.append((index, lo, hi))
    return sorted(by_signature.values(), key=lambda g: g.probe)


_NONZERO = re.compile(rb"[^\x00]")


def _bits(mask: int) -> Iterator[int]:
    """The set bits of ``mask``, lowest first; found by a byte scan, so a sparse mask of
    millions of bits costs one pass, not one pass per bit."""
    if not mask:
        return
    start = (mask & -mask).bit_length() - 1
    mask >>= start
    data = mask.to_bytes((mask.bit_length() + 7) // 8, "little")
    for found in _NONZERO.finditer(data):
        base, byte = start + found.start() * 8, data[found.start()]
        while byte:
            low = byte & -byte
            yield base + low.bit_length() - 1
            byte ^= low


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
        self.ends: list[tuple[int, int, _End]] = []
        self.notes: list[tuple[int, Cause]] = []
        self.surely_passed: set[int] = set()
        self.maybe_passed: set[int] = set()
        self.first_end: dict[int, _End] = {}
        self.first_sure: dict[int, _End] = {}
        self.causes: dict[int, Cause] = {}
        self.masks: dict[object, Masks] = {}
        self.passed = NOTHING
        self.base: Chain | None = None
        self.phase = BEFORE
        self.untracked = NOTHING  # the classes notrack has untracked, surely and maybe
        self.ct_version = 0  # counts the changes of ``untracked``

    def run(self, bases: list[tuple[Table, Chain]]) -> Flow:
        """The classes that every base chain accepts, surely and maybe."""
        flow = Flow(self.space.full, 0)
        for table, chain in bases:
            assert chain.hook is not None
            self.phase = phase(chain.hook)
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
            if rule.notrack_after is not None:
                self._notrack(rule, flow)
            flow, returned = self._step(place, rule, rule.action, self._rule_masks(rule), flow)
            back = back.join(returned)
        return back.join(flow)

    def _notrack(self, rule: Rule, flow: Flow) -> None:
        """The classes that meet the conditions before a rule's notrack become untracked
        (surely before conntrack, maybe at its priority; after it notrack does nothing)."""
        if self.phase is AFTER:
            return
        assert rule.notrack_after is not None
        masks = self._cond_masks(rule.conds[:rule.notrack_after])
        sure = flow.sure & masks.true if self.phase is BEFORE else 0
        maybe = (flow.sure | flow.maybe) & masks.possible & ~sure
        now = Flow(self.untracked.sure | sure, 0)
        now = Flow(now.sure, (self.untracked.maybe | maybe) & ~now.sure)
        if now != self.untracked:
            self.untracked, self.ct_version = now, self.ct_version + 1

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
        """The rule's masks; those of a rule that tests conntrack depend on the phase and
        on what notrack untracked, and are cached with them."""
        if any(isinstance(c, CtState | Tracked) for c in rule.conds):
            key: object = (id(rule), self.phase, self.ct_version)
        else:
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
        if isinstance(cond, CtState | Tracked):
            return self._conntrack(cond)
        if isinstance(cond, Unsure):
            return Masks(0, full, cond.reason)
        return Masks(0, 0, None)

    def _conntrack(self, cond: CtState | Tracked) -> Masks:
        """The classes a conntrack test holds for, given the phase of the chain and the
        classes notrack untracked."""
        def holds(state: str) -> bool:
            if isinstance(cond, CtState):
                return (state in cond.states) != cond.negate
            return cond.holds if state == "new" else cond.without_entry

        full = self.space.full
        tracked = {holds(s) for s in self.phase.states}
        values = [(full & ~self.untracked.sure & ~self.untracked.maybe, tracked),
                  (self.untracked.sure, {holds("untracked")}),
                  (self.untracked.maybe, tracked | {holds("untracked")})]
        true = possible = 0
        for mask, outcomes in values:
            true |= mask if outcomes == {True} else 0
            possible |= mask if True in outcomes else 0
        why = self.phase.why or "the packet may have been untracked by notrack"
        return Masks(true, possible, f"{why}: {cond.text}" if true != possible else None)

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
        """Classes of ``mask`` may end here; ``true``: those the rule surely matches."""
        if mask:
            self.ends.append((mask, true, _End(at, verdict)))

    def _note(self, mask: int, cause: Cause) -> None:
        """Classes of ``mask`` became uncertain here."""
        if mask:
            self.notes.append((mask, cause))

    def resolve(self, accepted: Flow) -> None:
        """Each class's first end, first end by a rule it surely matched and first cause,
        and which of the classes that may end may also get through every base chain."""
        left = left_sure = left_cause = self.space.full
        for mask, true, end in self.ends:
            new, new_sure = mask & left, mask & true & left_sure
            left, left_sure = left & ~new, left_sure & ~new_sure
            self.first_end.update(dict.fromkeys(_bits(new), end))
            self.first_sure.update(dict.fromkeys(_bits(new_sure), end))
        self.surely_passed = set(_bits(accepted.sure & ~left))
        self.maybe_passed = set(_bits(accepted.maybe & ~left))
        for mask, cause in self.notes:
            new = mask & left_cause
            left_cause &= ~new
            self.causes.update(dict.fromkeys(_bits(new), cause))

    def outcome(self, i: int) -> _Key:
        end = self.first_end.get(i)
        if end is None or i in self.surely_passed:
            return "accepted", None, None
        if i in self.maybe_passed:
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


_Base = tuple[int, int, Table, Chain]  # ruleset index, position in it, table, chain


def _order(bases: list[_Base], legacy_last: bool) -> list[tuple[Table, Chain]]:
    """Hook, priority, and of equal priority the one registered last first: within one
    ruleset the one listed last; between rulesets, the later ruleset's (``legacy_last``)
    or the earlier's."""
    def key(base: _Base) -> tuple[int, int, int, int]:
        ruleset, position, _, chain = base
        hook = chain.hook
        assert hook is not None
        return (HOOK_ORDER[hook.name], hook.priority,
                -ruleset if legacy_last else ruleset, -position)

    return [(t, c) for _, _, t, c in sorted(bases, key=key)]


class _Either:
    """Two runs over the same classes whose base chains of equal priority from different
    rulesets ran in either order: a class is what both say, else uncertain."""

    def __init__(self, first: _Run, second: _Run, cause: Cause) -> None:
        self.first, self.second, self.cause = first, second, cause
        self.first_end: dict[int, _End] = {}

    def resolve(self, accepted: tuple[Flow, Flow]) -> None:
        self.first.resolve(accepted[0])
        self.second.resolve(accepted[1])
        self.first_end = {**self.second.first_end, **self.first.first_end}

    def outcome(self, i: int) -> _Key:
        one, other = self.first.outcome(i), self.second.outcome(i)
        if one[0] == other[0]:
            return one
        at = one[1] or other[1]
        return "uncertain", at, self.cause


def analyse(rulesets: Sequence[Ruleset], sources: Sequence[str],
            ports: Sequence[tuple[int, int]], *, iif: str | None = None) -> Analysis:
    """What the rulesets together do to new TCP connections from each source to each port.

    Base chains of all rulesets run in hook, then priority order; of equal priority the
    one listed last (in the rulesets as given, then as each lists its tables and chains)
    runs first. ``iif`` is the interface cluster traffic arrives on (None: not known).
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
    listed: list[_Base] = [
        (index, position, t, c) for index, ruleset in enumerate(rulesets)
        for position, (t, c) in enumerate((t, c) for t in ruleset.tables
                                          for c in t.chains.values() if c.hook is not None)]
    space = _Space([r for t in tables for c in t.chains.values() for r in c.rules], parsed,
                   wanted)
    legacy_last, legacy_first = _order(listed, True), _order(listed, False)
    run = _Run(space, iif)
    accepted = run.run(legacy_last)
    if legacy_first == legacy_last:
        run.resolve(accepted)
        return Analysis(_findings(space, run), notes)
    other = _Run(space, iif)
    (t1, tie), (t2, other_tie) = next(
        (a, b) for a, b in zip(legacy_last, legacy_first, strict=True) if a[1] is not b[1])
    assert tie.hook is not None
    cause = Cause(Located(RuleRef(t1.label, tie.name, f"its order against {t2.label} chain "
                                                      f"{other_tie.name}"),
                          f"hook {tie.hook.name}, priority {tie.hook.priority}"),
                  "base chains of equal priority from nft and iptables run in the order they "
                  "were registered, which no listing shows")
    either = _Either(run, other, cause)
    either.resolve((accepted, other.run(legacy_first)))
    return Analysis(_findings(space, either), notes)


_ACCEPTED: _Key = ("accepted", None, None)


def _findings(space: _Space, run: _Run | _Either) -> tuple[Finding, ...]:
    """Adjacent port pieces of a group with the same outcome merged, then the groups with
    the same outcome for the same ports. Only classes that some rule may end are looked
    at one by one; the pieces between them are accepted (``run`` is resolved)."""
    ended: dict[int, list[int]] = {}
    for i in sorted(run.first_end):
        ended.setdefault(i // space.width, []).append(i % space.width)
    buckets: dict[tuple[int, int, _Key], list[int]] = {}
    for g in range(len(space.groups)):
        runs: list[tuple[int, int, _Key]] = []
        for lo, hi, key in _group_outcomes(space, run, g, ended.get(g, [])):
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


def _group_outcomes(space: _Space, run: _Run | _Either, g: int,
                    ended: list[int]) -> Iterator[tuple[int, int, _Key]]:
    """(first port, last port, outcome) of one group in port order: each ended piece, and
    the accepted stretches between them, cut where the requested port ranges have gaps."""
    previous = -1
    for p in [*ended, space.width]:
        if p > previous + 1:
            yield from _accepted_spans(space, previous + 1, p - 1)
        if p < space.width:
            lo, hi = space.pieces[p]
            yield lo, hi, run.outcome(g * space.width + p)
        previous = p


def _accepted_spans(space: _Space, first: int, last: int) -> Iterator[tuple[int, int, _Key]]:
    """Pieces ``first`` to ``last`` as port spans, one per requested range they touch."""
    cuts = space.range_starts
    start = first
    for cut in cuts[bisect.bisect_right(cuts, first):bisect.bisect_right(cuts, last)]:
        yield space.pieces[start][0], space.pieces[cut - 1][1], _ACCEPTED
        start = cut
    yield space.pieces[start][0], space.pieces[last][1], _ACCEPTED


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
