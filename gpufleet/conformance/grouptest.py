"""Adaptive group testing: find every bad node and every bad pair of a set of nodes whose
joint test fails, with a number of test rounds that grows as log n.

A *test* runs one collective job on a group of nodes; groups that share no node run at the
same time, in one *round*. A fault is a node that fails every group it is in, or a pair of
nodes that fails every group holding both. The search:

1. splits a failing set into halves (along the inventory's racks or leaves first, so a
   half is whole racks where it can be) and tests both halves at once;
2. follows a failing half down; when both halves pass, the fault spans them: one node of
   the left half is found by halving the left half against the whole right half (which
   passed), then its partner by halving the right half against that node;
3. classifies the suspect pair against known-good references (nodes that passed a group
   together, from the same rack when there is one): a suspect that fails with a good
   reference too is a bad node; when both pass with references, the pair is re-tested
   before it is blamed (confirm before blame);
4. looks for further faults in what is left once each found one is taken out;
5. names a node common to two bad pairs or more as the bad node when it failed every
   group it was in and each of its partners passed without it: the pairs were found
   against a reference that was that node (a good pair's run failed by chance, so no node
   was known good when the search began), and one bad node explains them all.

Single nodes are never tested here: each node has passed on its own before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

Group = tuple[str, ...]
ROUNDS_PER_LEVEL = 3
BASE_ROUNDS = 8
MAX_FAULTS = 8


@dataclass(frozen=True)
class Trial:
    """One group's test: whether it passed, and why not."""

    group: Group
    ok: bool
    problem: str | None = None
    round: int = 0


@dataclass
class Fault:
    """A bad node, or a bad pair (``nodes`` in the order the search found them)."""

    kind: Literal["node", "pair"]
    nodes: Group
    problem: str
    confirmed: bool
    evidence: list[Trial] = field(default_factory=list)
    note: str = ""

    def key(self) -> frozenset[str]:
        return frozenset(self.nodes)


@dataclass
class Search:
    """What the search found and every trial it ran."""

    faults: list[Fault] = field(default_factory=list)
    trials: list[Trial] = field(default_factory=list)
    rounds: int = 0
    max_rounds: int = 0
    exhausted: bool = False


Tester = Callable[[list[Group]], list[Trial]]


def max_rounds(count: int) -> int:
    """The rounds a search of ``count`` nodes may use: grows as log2 of the count."""
    return BASE_ROUNDS + ROUNDS_PER_LEVEL * math.ceil(math.log2(max(2, count)))


def split(group: Sequence[str], domains: dict[str, str] | None = None) -> tuple[Group, Group]:
    """Two halves of ``group``; with ``domains`` (node -> rack or leaf), whole domains go
    to one half where the group spans more than one."""
    names = list(group)
    by_domain: dict[str, list[str]] = {}
    for name in names:
        by_domain.setdefault((domains or {}).get(name, ""), []).append(name)
    if len(by_domain) > 1:
        left: list[str] = []
        right: list[str] = []
        for members in sorted(by_domain.values(), key=len, reverse=True):
            (left if len(left) <= len(right) else right).extend(members)
        if left and right:
            order = {n: i for i, n in enumerate(names)}
            return (tuple(sorted(left, key=order.__getitem__)),
                    tuple(sorted(right, key=order.__getitem__)))
    middle = len(names) // 2
    return tuple(names[:middle]), tuple(names[middle:])


class _Searcher:
    def __init__(self, nodes: Sequence[str], test: Tester, domains: dict[str, str] | None,
                 limit: int, known: Sequence[Trial]) -> None:
        self.nodes = list(nodes)
        self.test = test
        self.domains = domains or {}
        self.search = Search(max_rounds=limit)
        self.results: dict[frozenset[str], Trial] = {frozenset(t.group): t for t in known}

    # ---- running tests ------------------------------------------------------------------

    def passed_superset(self, group: Group) -> Trial | None:
        wanted = frozenset(group)
        for key, trial in self.results.items():
            if trial.ok and wanted <= key:
                return trial
        return None

    def run(self, groups: list[Group], fresh: bool = False) -> list[Trial]:
        """Test ``groups`` (disjoint groups in one round); results already known (or
        implied: a group inside one that passed passes) are not run again."""
        out: dict[int, Trial] = {}
        todo: list[tuple[int, Group]] = []
        for i, group in enumerate(groups):
            known = None if fresh else (self.results.get(frozenset(group))
                                        or self.passed_superset(group))
            if len(group) < 2:
                out[i] = Trial(group, True)
            elif known is not None:
                out[i] = known
            else:
                todo.append((i, group))
        if todo:
            if self.search.rounds >= self.search.max_rounds:
                self.search.exhausted = True
                raise _Exhausted
            self.search.rounds += 1
            trials = self.test([g for _, g in todo])
            for (i, _), answer in zip(todo, trials, strict=True):
                trial = Trial(answer.group, answer.ok, answer.problem, self.search.rounds)
                self.results[frozenset(trial.group)] = trial
                self.search.trials.append(trial)
                out[i] = trial
        return [out[i] for i in range(len(groups))]

    def one(self, group: Group, fresh: bool = False) -> Trial:
        return self.run([group], fresh)[0]

    # ---- references ---------------------------------------------------------------------

    def references(self, avoid: set[str]) -> list[str]:
        """Nodes that passed a group with others, best first (largest passing group), then
        the nodes that have only passed on their own."""
        good: list[str] = []
        for trial in sorted(self.results.values(), key=lambda t: -len(t.group)):
            if trial.ok and len(trial.group) >= 2:
                good += [n for n in trial.group if n not in good and n not in avoid]
        return good + [n for n in self.nodes if n not in good and n not in avoid]

    def reference_for(self, suspect: str, avoid: set[str]) -> str | None:
        """A known-good node for ``suspect``, from its own rack or leaf when possible."""
        refs = self.references(avoid)
        same = [r for r in refs if self.domains.get(r) == self.domains.get(suspect)]
        best = same or refs
        return best[0] if best else None

    # ---- locating -----------------------------------------------------------------------

    def locate(self, group: Group) -> list[Fault]:
        """Faults inside ``group``, which failed and holds no fault found before."""
        if len(group) == 2:
            return self.classify(group[0], group[1], self.results[frozenset(group)])
        left, right = split(group, self.domains)
        result_left, result_right = self.run([left, right])
        if not result_left.ok:
            return self.locate(left)
        if not result_right.ok:
            return self.locate(right)
        a = self.narrow(left, right)
        b = self.narrow(right, (a,))
        return self.classify(a, b, self.results[frozenset((a, b))])

    def narrow(self, candidates: Group, partners: Group) -> str:
        """The node of ``candidates`` that fails together with ``partners`` (each passes on
        its own), by halving ``candidates``."""
        while len(candidates) > 1:
            first, second = split(candidates, self.domains)
            trial = self.one(tuple(sorted(first + partners)))
            candidates = first if not trial.ok else second
        if len(partners) == 1:
            self.one(tuple(sorted(candidates + partners)))
        return candidates[0]

    def classify(self, a: str, b: str, failed: Trial) -> list[Fault]:
        """Bad node(s) or bad pair, each checked against known-good references."""
        ref_a = self.reference_for(a, {a, b})
        ref_b = self.reference_for(b, {a, b, *([ref_a] if ref_a else [])}) or ref_a
        if ref_a is None or ref_b is None:
            return [Fault("pair", (a, b), failed.problem or "failed", False, [failed],
                          "no third node to tell a bad node from a bad pair")]
        if ref_b == ref_a:
            with_a, with_b = self.one((a, ref_a), fresh=True), self.one((b, ref_b), fresh=True)
        else:
            with_a, with_b = self.run([(a, ref_a), (b, ref_b)], fresh=True)
        if with_a.ok and with_b.ok:
            again = self.one((a, b), fresh=True)
            return [Fault("pair", (a, b), (again.problem if not again.ok else failed.problem)
                          or "failed", not again.ok, [failed, with_a, with_b, again],
                          "" if not again.ok else "the pair passed when re-tested: intermittent")]
        return [self.confirm_node(node, trial) for node, trial in ((a, with_a), (b, with_b))
                if not trial.ok]

    def confirm_node(self, node: str, failed: Trial) -> Fault:
        """A node that failed with one good reference, re-tested with another."""
        used = set(failed.group)
        other = self.reference_for(node, used)
        if other is None:
            return Fault("node", (node,), failed.problem or "failed", True, [failed],
                         "one reference only")
        again = self.one((node, other), fresh=True)
        if again.ok:
            return Fault("pair", failed.group, failed.problem or "failed", True,
                         [failed, again], f"{node} passed with {other}")
        return Fault("node", (node,), failed.problem or "failed", True, [failed, again])

    # ---- what is left -------------------------------------------------------------------

    def remainders(self, group: Group, faults: list[Fault]) -> list[Group]:
        """Subsets of ``group`` holding no known fault, which together hold every pair of
        ``group`` that no known fault explains."""
        bad_nodes = {f.nodes[0] for f in faults if f.kind == "node"}
        base = tuple(n for n in group if n not in bad_nodes)
        subsets = [base]
        for fault in faults:
            if fault.kind != "pair":
                continue
            nxt = []
            for subset in subsets:
                if set(fault.nodes) <= set(subset):
                    nxt += [tuple(n for n in subset if n != fault.nodes[0]),
                            tuple(n for n in subset if n != fault.nodes[1])]
                else:
                    nxt.append(subset)
            subsets = nxt
        unique = {frozenset(s): s for s in subsets if len(s) >= 2}
        return sorted(unique.values(), key=len, reverse=True)


def common_nodes(faults: list[Fault], trials: Sequence[Trial]) -> list[Fault]:
    """``faults`` with the bad pairs that share a node merged into that node's fault where
    the node explains them: it is in two of them or more, no group holding it and another
    node passed in ``trials``, and each of its partners passed in a group without it. Pairs
    no single node explains are kept."""
    out = list(faults)
    while True:
        pairs = [f for f in out if f.kind == "pair"]
        counts: dict[str, int] = {}
        for fault in pairs:
            for name in fault.nodes:
                counts[name] = counts.get(name, 0) + 1
        found = next((n for n in sorted(counts, key=lambda n: (-counts[n], n))
                      if counts[n] >= 2 and _explains(n, pairs, trials)), None)
        if found is None:
            return out
        merged = [f for f in pairs if found in f.nodes]
        partners = [next(n for n in f.nodes if n != found) for f in merged]
        evidence = list(dict.fromkeys(t for f in merged for t in f.evidence))
        node = Fault("node", (found,), merged[0].problem, all(f.confirmed for f in merged),
                     evidence, f"fails with {', '.join(partners)}, which pass without it")
        at = out.index(merged[0])
        out = [f for f in out if not (f.kind == "pair" and found in f.nodes)]
        out.insert(at, node)


def _explains(name: str, pairs: list[Fault], trials: Sequence[Trial]) -> bool:
    """Whether ``name`` failed every group it was in with another node, and each of its
    partners in ``pairs`` passed in a group without it."""
    partners = {n for f in pairs if name in f.nodes for n in f.nodes if n != name}
    if any(t.ok and name in t.group and len(t.group) >= 2 for t in trials):
        return False
    return all(any(t.ok and p in t.group and name not in t.group and len(t.group) >= 2
                   for t in trials) for p in partners)


class _Exhausted(Exception):
    """The search used the rounds it was given."""


def find_faults(nodes: Sequence[str], test: Tester, *, domains: dict[str, str] | None = None,
                known: Sequence[Trial] = (), limit: int | None = None) -> Search:
    """Every fault among ``nodes`` (each of which passed on its own), within ``limit`` rounds
    (default ``max_rounds(len(nodes))``). ``known`` holds trials already run (a failing run
    of all nodes, passing pairs), which the search uses instead of running them again."""
    rounds = limit if limit is not None else max_rounds(len(nodes))
    searcher = _Searcher(nodes, test, domains, rounds, known)
    search = searcher.search
    whole = tuple(nodes)
    try:
        if len(whole) < 2 or searcher.one(whole).ok:
            return search
        pending = sorted((t.group for t in searcher.results.values()
                          if not t.ok and len(t.group) < len(whole)), key=len)
        pending.append(whole)
        while pending and len(search.faults) < MAX_FAULTS:
            group = pending.pop(0)
            known_keys = {f.key() for f in search.faults}
            if any(k <= set(group) for k in known_keys):
                continue
            found = [f for f in searcher.locate(group) if f.key() not in known_keys]
            if not found:
                break
            search.faults += found
            for rest in searcher.remainders(whole, search.faults):
                if not searcher.one(rest).ok:
                    pending.append(rest)
                    break
    except _Exhausted:
        pass
    search.faults = common_nodes(search.faults, [*known, *search.trials])
    return search
