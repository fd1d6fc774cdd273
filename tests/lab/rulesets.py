"""Seeded random firewall rulesets for the differential test of the firewall analysis
against the kernel (tests/lab/test_firewall_kernel.py). Pure: no I/O.

A case is what one run loads into the server namespace: an nft script, an
iptables-nft-restore and an iptables-legacy-restore text (each may be empty), the cluster
sources, and the probes: (source, port) pairs at the rendezvous port, the range bounds,
every port bound a rule mentions and one either side of it, and a sample of the range.

The rules cover nft tables of the families inet, ip and netdev (ingress chains on the
server's interface, or on ``lo``), base chains at ingress, prerouting (raw priorities below
-200, never -200 itself, whose order against conntrack is the kernel's registration
order) and input, equal priorities in different tables, both policies, named and
anonymous sets, interval sets of ports, addresses and address-port pairs, verdict maps,
jump, goto and return, the reject variants, ``ct state`` (negated as a set and as flags),
notrack, interface, source, destination, protocol, TCP flag and fib tests, rate limits;
and iptables rules for both backends (raw, mangle and filter, policies, user chains with
-j, -g and RETURN, multiport, iprange, conntrack and state, addrtype, REJECT variants,
CT --notrack and NOTRACK). Some cases hold one of the :data:`PATTERNS`.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable
from dataclasses import dataclass, field

RENDEZVOUS = 29500
RANGE = (49152, 65535)
PORTS: tuple[tuple[int, int], ...] = ((RENDEZVOUS, RENDEZVOUS), RANGE)
"""The requested ports, as the firewall check asks for them."""
MAX_PROBES = 150

_HOSTS = ("1.1", "1.127", "1.128", "1.255", "2.0", "2.77", "3.200", "4.9", "64.1",
          "128.128", "255.254")
"""Host parts of the client addresses, several on the edges of prefixes."""


@dataclass(frozen=True)
class Net:
    """The lab's ``10.{octet}.0.0/16`` and the server's interface (cluster traffic's iif)."""

    octet: int
    iif: str

    @property
    def server(self) -> str:
        return f"10.{self.octet}.0.1"

    @property
    def client(self) -> str:
        return f"10.{self.octet}.0.2"

    @property
    def pool(self) -> tuple[str, ...]:
        """The client addresses cases draw their sources from."""
        return tuple(f"10.{self.octet}.{host}" for host in _HOSTS)


@dataclass(frozen=True)
class Size:
    """Upper bounds of a generated ruleset."""

    tables: int
    bases: int
    regular: int
    rules: int
    iptables_rules: int


SMALL = Size(tables=3, bases=2, regular=2, rules=5, iptables_rules=5)
LARGE = Size(tables=6, bases=3, regular=4, rules=12, iptables_rules=16)


@dataclass(frozen=True)
class Case:
    """One generated case; ``pattern`` names the pattern of :data:`PATTERNS` it holds."""

    seed: int
    nft: str
    iptables_nft: str
    iptables_legacy: str
    sources: tuple[str, ...]
    probes: tuple[tuple[str, int], ...]
    pattern: str = ""

    def text(self) -> str:
        """Everything the case loads, as one text for a report."""
        head = f"# case {self.seed}" + (f" ({self.pattern})" if self.pattern else "")
        parts = [f"{head}: sources {', '.join(self.sources)}"]
        for title, body in (("nft -f", self.nft), ("iptables-nft-restore", self.iptables_nft),
                            ("iptables-legacy-restore", self.iptables_legacy)):
            if body:
                parts += [f"## {title}", body.rstrip()]
        return "\n".join(parts) + "\n"


_PRIORITIES = {"ingress": (-300, -10, 0, 10),
               "prerouting": (-350, -300, -250, -201, -150, -100, -10, 0, 10, 100),
               "input": (-300, -150, -100, -10, 0, 10, 50, 100, 200)}
_HOOKS = {"inet": ("ingress", "prerouting", "prerouting", "input", "input", "input"),
          "ip": ("prerouting", "input", "input"), "netdev": ("ingress",)}
_CT_STATES = ("new", "established,related", "invalid", "untracked", "new,untracked",
              "established")
_NFT_EXTRAS = {
    "inet": ("meta l4proto tcp", "meta nfproto ipv4", "ip protocol tcp",
             "tcp flags syn", "tcp flags & (syn | ack) == syn", "meta pkttype host",
             "ct direction original", "ct status dnat", "ct status != dnat",
             "ip daddr {server}", "ip daddr 127.0.0.1"),
    "ip": ("meta l4proto tcp", "ip protocol tcp", "tcp flags syn",
           "tcp flags & (syn | ack) == syn", "meta pkttype host", "ct direction original",
           "ct status dnat", "ip daddr {server}", "ip daddr 127.0.0.1"),
    "netdev": ("meta protocol ip", "ip protocol tcp", "tcp flags syn", "meta pkttype host",
               "ip daddr {server}")}
"""Matches on what a SYN to the server carries, decided by the analysis (most of them)."""
_FIB = ("fib daddr type local", "fib saddr . iif oif missing", "fib daddr type != local")
_REJECTS = {"inet": ("reject", "reject with tcp reset", "reject with icmpx type admin-prohibited"),
            "netdev": ("reject", "reject with tcp reset",
                       "reject with icmpx type port-unreachable"),
            "ip": ("reject", "reject with tcp reset", "reject with icmp type host-prohibited")}


def _in_ports(port: int) -> bool:
    return any(lo <= port <= hi for lo, hi in PORTS)


@dataclass
class _Table:
    family: str
    name: str
    decls: list[str] = field(default_factory=list)
    chains: list[tuple[str, str, list[str]]] = field(default_factory=list)

    def text(self) -> str:
        lines = [f"table {self.family} {self.name} {{", *self.decls]
        for name, header, rules in self.chains:
            lines.append(f"  chain {name} {{")
            if header:
                lines.append(f"    {header}")
            lines += [f"    {rule}" for rule in rules]
            lines.append("  }")
        return "\n".join([*lines, "}"])


@dataclass
class _Chain:
    """Where a rule is written: its table, and its hook and priority (regular: none)."""

    table: _Table
    hook: str | None
    priority: int
    later: list[str]

    @property
    def raw(self) -> bool:
        """A prerouting base chain that runs before conntrack."""
        return self.hook == "prerouting" and self.priority < -200


@dataclass
class _Save:
    """One iptables table being written: chains (policy or ``-``) and rules."""

    name: str
    chains: dict[str, str] = field(default_factory=dict)
    rules: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join([f"*{self.name}", *(f":{c} {p} [0:0]" for c, p in self.chains.items()),
                          *self.rules, "COMMIT"])


_BUILTIN = {"raw": ("PREROUTING", "OUTPUT"),
            "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
            "filter": ("INPUT", "FORWARD", "OUTPUT")}


class _Gen:
    """Draws one case; every port bound it writes is kept for the probes."""

    def __init__(self, seed: int, net: Net, size: Size) -> None:
        self.rng = random.Random(seed)
        self.net = net
        self.size = size
        self.sources = sorted(self.rng.sample(net.pool, self.rng.randint(3, 6)),
                              key=ipaddress.IPv4Address)
        self.bounds: set[int] = set()
        self.names = 0
        self.tables: list[_Table] = []
        self.saves: dict[str, dict[str, _Save]] = {"nft": {}, "legacy": {}}
        self.used: dict[str, list[int]] = {hook: [] for hook in _PRIORITIES}

    def name(self, prefix: str) -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    # ---------------------------------------------------------------- ports and addresses

    def port(self) -> int:
        rng = self.rng
        pick = rng.random()
        if pick < 0.2:
            port = RENDEZVOUS
        elif pick < 0.3:
            port = rng.choice(RANGE)
        elif pick < 0.4:
            port = rng.randint(RANGE[0] - 60, RANGE[0] + 60)
        elif pick < 0.47:
            port = rng.choice((22, 80, 8080, 29499, 29501, 40000))
        else:
            port = rng.randint(*RANGE)
        self.bounds.add(port)
        return port

    def span(self) -> tuple[int, int]:
        """A port or a range of ports."""
        rng = self.rng
        if self.chance(0.45):
            port = self.port()
            return port, port
        pick = rng.random()
        if pick < 0.05:
            lo, hi = RANGE
        elif pick < 0.15:
            lo, hi = rng.randint(29480, 29500), rng.randint(29500, 29520)
        elif pick < 0.35:
            lo, hi = rng.randint(RANGE[0] - 500, RANGE[0]), rng.randint(RANGE[0], 50000)
        else:
            lo = rng.randint(*RANGE)
            hi = min(RANGE[1], lo + rng.choice((1, 2, 9, 99, 999, 4999, 16383)))
        self.bounds.update((lo, hi))
        return lo, hi

    def spans(self, count: int) -> list[tuple[int, int]]:
        """Disjoint, not adjacent spans (nft refuses overlapping interval elements)."""
        kept: list[tuple[int, int]] = []
        for lo, hi in sorted(self.span() for _ in range(count)):
            if not kept or lo > kept[-1][1] + 1:
                kept.append((lo, hi))
        return kept

    def addr(self) -> tuple[int, int, str]:
        """An address test's operand: (first, last, text) of an address, prefix or range."""
        rng = self.rng
        base = int(ipaddress.IPv4Address(rng.choice([*self.sources, *self.net.pool])))
        net16 = int(ipaddress.IPv4Address(f"10.{self.net.octet}.0.0"))
        pick = rng.random()
        if pick < 0.55:
            length = rng.choice((32, 32, 31, 30, 28, 25, 24, 24, 23, 20, 17, 16))
            network = ipaddress.IPv4Network((base, length), strict=False)
            lo, hi = int(network.network_address), int(network.broadcast_address)
            text = str(network.network_address) if length == 32 else str(network)
            return lo, hi, text
        if pick < 0.85:
            lo = max(net16 + 3, base - rng.choice((0, 1, 5, 40, 300)))
            hi = min(net16 + 65534, base + rng.choice((0, 1, 5, 40, 300)))
            if lo == hi:
                return lo, hi, str(ipaddress.IPv4Address(lo))
            return lo, hi, f"{ipaddress.IPv4Address(lo)}-{ipaddress.IPv4Address(hi)}"
        other = rng.choice((f"10.{self.net.octet}.77.0/24", "192.168.0.0/16",
                            f"10.{self.net.octet}.0.0/16"))
        network = ipaddress.IPv4Network(other)
        return int(network.network_address), int(network.broadcast_address), other

    def addrs(self, count: int) -> list[str]:
        kept: list[tuple[int, int, str]] = []
        for item in sorted(self.addr() for _ in range(count)):
            if not kept or item[0] > kept[-1][1] + 1:
                kept.append(item)
        return [text for _, _, text in kept]

    # ---------------------------------------------------------------- nft

    def nft_ports(self, chain: _Chain) -> str:
        spans = self.spans(self.rng.randint(1, 4))
        texts = [f"{lo}" if lo == hi else f"{lo}-{hi}" for lo, hi in spans]
        if len(texts) > 1 and self.chance(0.35):
            name = self.name("ports")
            chain.table.decls.append(
                f"  set {name} {{\n    type inet_service\n    flags interval\n"
                f"    elements = {{ {', '.join(texts)} }}\n  }}")
            return f"@{name}"
        return texts[0] if len(texts) == 1 else f"{{ {', '.join(texts)} }}"

    def nft_addrs(self, chain: _Chain) -> str:
        texts = self.addrs(self.rng.randint(1, 3))
        if len(texts) > 1 and self.chance(0.35):
            name = self.name("addrs")
            chain.table.decls.append(
                f"  set {name} {{\n    type ipv4_addr\n    flags interval\n"
                f"    elements = {{ {', '.join(texts)} }}\n  }}")
            return f"@{name}"
        return texts[0] if len(texts) == 1 else f"{{ {', '.join(texts)} }}"

    def iface(self) -> str:
        iif = self.net.iif
        return self.rng.choice((
            f'iifname "{iif}"', f'iifname != "{iif}"', 'iifname "eth9"', f'iifname "{iif[:4]}*"',
            'iifname != "lo"', f'iif "{iif}"', 'iif "lo"', 'iif != "lo"',
            f'iifname {{ "lo", "{iif}" }}'))

    def ct_state(self) -> str:
        """A ``ct state`` test; a negated list is written as a set or as flags (``!= a,b``,
        which compares the whole state with the flags together)."""
        state = self.rng.choice(_CT_STATES)
        if not self.chance(0.25):
            return f"ct state {state}"
        if "," in state and self.chance(0.5):
            return f"ct state != {{ {state.replace(',', ', ')} }}"
        return f"ct state != {state}"

    def pairs(self, chain: _Chain) -> str:
        """``ip saddr . tcp dport`` against a set of (address, port span) pairs."""
        elements = ", ".join(f"{addr} . {lo}" if lo == hi else f"{addr} . {lo}-{hi}"
                             for addr in self.addrs(self.rng.randint(1, 3))
                             for lo, hi in [self.span()])
        if self.chance(0.4):
            name = self.name("pairs")
            chain.table.decls.append(
                f"  set {name} {{\n    type ipv4_addr . inet_service\n    flags interval\n"
                f"    elements = {{ {elements} }}\n  }}")
            return f"ip saddr . tcp dport @{name}"
        return f"ip saddr . tcp dport {{ {elements} }}"

    def nft_matches(self, chain: _Chain) -> list[str]:
        rng, matches = self.rng, []
        family = chain.table.family
        if self.chance(0.35):
            matches.append(f"ip saddr {'!= ' if self.chance(0.2) else ''}{self.nft_addrs(chain)}")
        if self.chance(0.15):
            matches.append(self.iface())
        if family != "netdev" and self.chance(0.25):
            matches.append(self.ct_state())
        if self.chance(0.1):
            extra = rng.choice(_NFT_EXTRAS[family])
            if chain.hook in ("prerouting", "input") and self.chance(0.25):
                extra = rng.choice(_FIB)
            matches.append(extra.format(server=self.net.server))
        if self.chance(0.06):
            matches.append(self.pairs(chain))
        elif self.chance(0.7):
            field = "th dport" if self.chance(0.1) else "tcp dport"
            matches.append(f"{field} {'!= ' if self.chance(0.12) else ''}"
                           f"{self.nft_ports(chain)}")
        if self.chance(0.03):
            matches.append("limit rate 5/second")
        return matches

    def nft_action(self, chain: _Chain) -> str:
        rng = self.rng
        choices: list[tuple[float, Callable[[], str]]] = [
            (3, lambda: "accept"), (3, lambda: "drop"),
            (2, lambda: rng.choice(_REJECTS[chain.table.family])), (1, lambda: "counter")]
        if chain.later:
            choices += [(1.5, lambda: f"jump {rng.choice(chain.later)}"),
                        (0.7, lambda: f"goto {rng.choice(chain.later)}")]
        choices.append((1 if chain.hook is None else 0.1, lambda: "return"))
        if chain.hook == "prerouting":
            choices.append((2 if chain.raw else 0.3, lambda: "notrack"))
        total = sum(weight for weight, _ in choices)
        pick = rng.random() * total
        for weight, make in choices:
            pick -= weight
            if pick < 0:
                return make()
        return choices[-1][1]()

    def map_verdict(self, chain: _Chain) -> str:
        verdicts = ["accept", "drop"] + (["return"] if chain.hook is None else [])
        if chain.later:
            verdicts += [f"jump {self.rng.choice(chain.later)}",
                         f"goto {self.rng.choice(chain.later)}"]
        return self.rng.choice(verdicts)

    def vmap(self, chain: _Chain) -> str:
        """A verdict map on the port, the source or (before or after conntrack) the state."""
        rng = self.rng
        pick = rng.random()
        if pick < 0.15 and chain.table.family != "netdev":
            return "ct state vmap { invalid : drop, established : accept, related : accept }"
        if pick < 0.55:
            keys = [f"{lo}" if lo == hi else f"{lo}-{hi}"
                    for lo, hi in self.spans(rng.randint(1, 4))]
            selector, kind = "tcp dport", "inet_service"
        else:
            keys, selector, kind = self.addrs(rng.randint(1, 3)), "ip saddr", "ipv4_addr"
        elements = ", ".join(f"{key} : {self.map_verdict(chain)}" for key in keys)
        if self.chance(0.35):
            name = self.name("map")
            chain.table.decls.append(
                f"  map {name} {{\n    type {kind} : verdict\n    flags interval\n"
                f"    elements = {{ {elements} }}\n  }}")
            return f"{selector} vmap @{name}"
        return f"{selector} vmap {{ {elements} }}"

    def nft_rule(self, chain: _Chain) -> str:
        if self.chance(0.12):
            prefix = " ".join(self.nft_matches(chain)[:1])
            return f"{prefix} {self.vmap(chain)}".strip()
        matches, action = self.nft_matches(chain), self.nft_action(chain)
        if not matches and action.startswith(("drop", "reject")):
            matches = [f"tcp dport {self.nft_ports(chain)}"]
        return " ".join([*matches, action])

    def opening(self) -> list[tuple[int, int]]:
        """What a chain with a drop policy opens first: the rendezvous port and some range."""
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted([(RENDEZVOUS, RENDEZVOUS), *self.spans(self.rng.randint(1, 3))]):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        return merged

    def priority(self, hook: str) -> int:
        used = self.used[hook]
        if used and self.chance(0.3):
            return self.rng.choice(used)
        priority = self.rng.choice(_PRIORITIES[hook])
        used.append(priority)
        return priority

    def nft_table(self) -> _Table:
        rng = self.rng
        family = rng.choice(("inet", "inet", "inet", "ip", "ip", "netdev"))
        table = _Table(family, self.name(rng.choice(("filter", "site", "hard", "t"))))
        regular = [self.name("c") for _ in range(rng.randint(0, self.size.regular))]
        for index, name in enumerate(regular):
            chain = _Chain(table, None, 0, regular[index + 1:])
            rules = [self.nft_rule(chain) for _ in range(rng.randint(1, self.size.rules))]
            table.chains.append((name, "", rules))
        for _ in range(rng.randint(1, self.size.bases)):
            hook = rng.choice(_HOOKS[family])
            priority = self.priority(hook)
            policy = "drop" if self.chance(0.15) else "accept"
            device = ""
            if hook == "ingress":
                device = f' device "{"lo" if self.chance(0.1) else self.net.iif}"'
            chain = _Chain(table, hook, priority, regular)
            rules = [self.nft_rule(chain) for _ in range(rng.randint(0, self.size.rules))]
            if policy == "drop":
                opened = ", ".join(f"{lo}" if lo == hi else f"{lo}-{hi}"
                                   for lo, hi in self.opening())
                rules.insert(rng.randint(0, min(1, len(rules))),
                             f"tcp dport {{ {opened} }} accept")
            header = (f"type filter hook {hook}{device} priority {priority}; "
                      f"policy {policy};")
            table.chains.append((self.name(hook[:3]), header, rules))
        return table

    # ---------------------------------------------------------------- iptables

    def save(self, backend: str, table: str) -> _Save:
        tables = self.saves[backend]
        if table not in tables:
            tables[table] = _Save(table, dict.fromkeys(_BUILTIN[table], "ACCEPT"))
        return tables[table]

    def ipt_matches(self) -> list[str]:
        rng, words = self.rng, []
        if self.chance(0.15):
            iif = self.net.iif
            words.append(rng.choice((f"-i {iif}", f"! -i {iif}", "-i lo", "! -i lo",
                                     f"-i {iif[:4]}+", "-i eth9")))
        if self.chance(0.35):
            text = self.addr()[2]
            negate = "! " if self.chance(0.2) else ""
            if "-" in text:
                words.append(f"-m iprange {negate}--src-range {text}")
            else:
                words.append(f"{negate}-s {text}")
        if self.chance(0.75):
            spans = self.spans(rng.randint(1, 4))
            texts = [f"{lo}" if lo == hi else f"{lo}:{hi}" for lo, hi in spans]
            negate = "! " if self.chance(0.12) else ""
            if len(texts) == 1 and self.chance(0.6):
                flags = rng.choice(("", "", "", "--syn ", "--tcp-flags SYN,ACK SYN "))
                words.append(f"-p tcp -m tcp {flags}{negate}--dport {texts[0]}")
            else:
                words.append(f"-p tcp -m multiport {negate}--dports {','.join(texts)}")
        if self.chance(0.25):
            state = rng.choice(("NEW", "ESTABLISHED,RELATED", "INVALID", "UNTRACKED",
                                "NEW,UNTRACKED"))
            negate = "! " if self.chance(0.2) else ""
            module = rng.choice(("-m conntrack {n}--ctstate", "-m state {n}--state"))
            words.append(f"{module.format(n=negate)} {state}")
        if self.chance(0.08):
            words.append(rng.choice((
                "-m addrtype --dst-type LOCAL", "-m conntrack --ctdir ORIGINAL",
                "-m conntrack --ctproto tcp", f"-d {self.net.server}", "-d 127.0.0.1",
                "-m comment --comment gf")))
        if self.chance(0.03):
            words.append("-m limit --limit 5/second")
        return words

    def ipt_rule(self, table: str, chain: str, later: list[str]) -> str:
        """``-A CHAIN matches... target``; a DROP or REJECT always tests the port."""
        words = self.ipt_matches()
        target = self.ipt_target(table, chain, later, words)
        if target.startswith(("-j DROP", "-j REJECT")) and not words:
            lo, hi = self.span()
            words.append(f"-p tcp -m tcp --dport {lo}:{hi}")
        return " ".join([f"-A {chain}", *words, target])

    def ipt_target(self, table: str, chain: str, later: list[str], words: list[str]) -> str:
        rng = self.rng
        targets = ["ACCEPT", "DROP"]
        if table == "filter":
            targets += ["REJECT", "REJECT"]
        if table == "raw":
            targets += ["CT --notrack", "NOTRACK", "CT --notrack"]
        if chain not in _BUILTIN[table]:
            targets.append("RETURN")
        target = rng.choice(targets) if not self.chance(0.04) else "LOG"
        if later and self.chance(0.3):
            return f"{rng.choice(('-j', '-j', '-g'))} {rng.choice(later)}"
        if target == "REJECT":
            tcp = any(word.startswith("-p tcp") for word in words)
            with_ = rng.choice(("", " --reject-with icmp-host-prohibited",
                                *([" --reject-with tcp-reset"] * 2 if tcp else [])))
            return f"-j REJECT{with_}"
        return f"-j {target}"

    def iptables(self, backend: str) -> None:
        """Rules for one backend: raw and mangle PREROUTING, filter INPUT, user chains."""
        rng = self.rng
        budget = rng.randint(1, self.size.iptables_rules)
        if self.chance(0.4):
            raw = self.save(backend, "raw")
            if self.chance(0.1):
                raw.chains["PREROUTING"] = "DROP"
                raw.rules.append(self.opening_rule("PREROUTING"))
            raw.rules += [self.ipt_rule("raw", "PREROUTING", [])
                          for _ in range(rng.randint(1, max(1, budget // 3)))]
        if self.chance(0.15):
            mangle = self.save(backend, "mangle")
            mangle.rules.append(self.ipt_rule("mangle", rng.choice(("PREROUTING", "INPUT")), []))
        filt = self.save(backend, "filter")
        if self.chance(0.15):
            filt.chains["INPUT"] = "DROP"
            filt.rules.append(self.opening_rule("INPUT"))
        user = [self.name("U") for _ in range(rng.randint(0, 2))]
        filt.chains.update(dict.fromkeys(user, "-"))
        for index, chain in enumerate(["INPUT", *user]):
            later = user[index:]
            filt.rules += [self.ipt_rule("filter", chain, later)
                           for _ in range(rng.randint(0 if chain == "INPUT" else 1, budget))]

    def opening_rule(self, chain: str) -> str:
        opened = ",".join(f"{lo}" if lo == hi else f"{lo}:{hi}" for lo, hi in self.opening())
        return f"-A {chain} -p tcp -m multiport --dports {opened} -j ACCEPT"

    def save_text(self, backend: str) -> str:
        return "".join(t.text() + "\n" for t in self.saves[backend].values())

    # ---------------------------------------------------------------- probes

    def probes(self) -> tuple[tuple[str, int], ...]:
        rng = self.rng
        fixed = [RENDEZVOUS, *RANGE]
        edges = sorted({p + d for p in self.bounds for d in (-1, 0, 1)} - set(fixed))
        sample = sorted({rng.randint(*RANGE) for _ in range(8)} - set(fixed) - set(edges))
        ports = [*fixed, *[p for p in edges if _in_ports(p)], *sample][:MAX_PROBES]
        budget = MAX_PROBES - len(fixed) * len(self.sources)
        each = max(1, min(len(self.sources), budget // max(1, len(ports) - len(fixed))))
        probes = [(s, p) for p in fixed for s in self.sources]
        for port in ports[len(fixed):]:
            probes += [(s, port) for s in sorted(rng.sample(self.sources, each))]
        return tuple(probes[:MAX_PROBES])


# -------------------------------------------------------------------- hardening patterns


def _ports_text(g: _Gen) -> str:
    lo = g.rng.randint(*RANGE)
    hi = min(RANGE[1], lo + g.rng.choice((0, 10, 500)))
    g.bounds.update((lo, hi))
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _raw_priority(g: _Gen) -> int:
    return g.rng.choice((-300, -300, -250, -201))


def _invalid_drop(g: _Gen) -> None:
    """``ct state invalid drop`` before conntrack: every packet is invalid there."""
    table = _Table("inet", g.name("hard"))
    rule = g.rng.choice(("ct state invalid drop", "ct state invalid counter drop",
                         "ct state vmap { invalid : drop, established : accept, "
                         "related : accept }"))
    table.chains.append(("pre", f"type filter hook prerouting priority {_raw_priority(g)}; "
                         "policy accept;", [rule]))
    g.tables.append(table)


def _new_accept_reject(g: _Gen) -> None:
    """``ct state new accept`` before conntrack, then a reject."""
    table = _Table(g.rng.choice(("inet", "ip")), g.name("hard"))
    ports = _ports_text(g)
    rules = [g.rng.choice(("ct state new accept", f"ct state new tcp dport {ports} accept",
                           "ct state established,related,new accept")),
             f"tcp dport {{ {RENDEZVOUS}, {ports} }} "
             f"{g.rng.choice(('reject', 'reject with tcp reset'))}"]
    table.chains.append(("pre", f"type filter hook prerouting priority {_raw_priority(g)}; "
                         "policy accept;", rules))
    g.tables.append(table)


def _notrack_stateful(g: _Gen) -> None:
    """The range notracked at raw priority; input accepts ``ct state new`` on a drop policy."""
    table = _Table("inet", g.name("hard"))
    table.chains.append(("raw", f"type filter hook prerouting priority {_raw_priority(g)}; "
                         "policy accept;", [f"tcp dport {RANGE[0]}-{RANGE[1]} notrack"]))
    table.chains.append(("in", "type filter hook input priority 0; policy drop;", [
        "ct state established,related accept",
        f"ct state new tcp dport {{ {RENDEZVOUS}, {RANGE[0]}-{RANGE[1]} }} accept"]))
    g.tables.append(table)


def _notrack_untracked(g: _Gen) -> None:
    """Notracked ports admitted by ``ct state untracked accept`` on a drop policy."""
    table = _Table("inet", g.name("hard"))
    ports = _ports_text(g)
    table.chains.append(("raw", f"type filter hook prerouting priority {_raw_priority(g)}; "
                         "policy accept;", [f"tcp dport {{ {RENDEZVOUS}, {ports} }} notrack"]))
    table.chains.append(("in", "type filter hook input priority 10; policy drop;", [
        "ct state untracked accept", f"tcp dport {ports} accept"]))
    g.tables.append(table)


def _new_drop_raw(g: _Gen) -> None:
    """``ct state new tcp dport X drop`` at raw priority: no packet is new there."""
    table = _Table("inet", g.name("hard"))
    table.chains.append(("pre", f"type filter hook prerouting priority {_raw_priority(g)}; "
                         "policy accept;", [f"ct state new tcp dport {_ports_text(g)} drop"]))
    g.tables.append(table)


def _ingress_state(g: _Gen) -> None:
    """``ct state`` in an inet ingress chain, which runs before conntrack."""
    table = _Table("inet", g.name("hard"))
    ports = _ports_text(g)
    rule = g.rng.choice(("ct state invalid drop", f"ct state new tcp dport {ports} drop",
                         f"ct state != established,related tcp dport {ports} drop"))
    table.chains.append(("ing", f'type filter hook ingress device "{g.net.iif}" priority 0; '
                         "policy accept;", [rule]))
    g.tables.append(table)


def _equal_priority(g: _Gen) -> None:
    """Two tables' input chains at one priority, one dropping, one rejecting a port."""
    ports = _ports_text(g)
    priority = g.rng.choice((-10, 0, 10))
    for action in g.rng.sample(("drop", "reject"), 2):
        table = _Table("inet", g.name("tie"))
        table.chains.append(("in", f"type filter hook input priority {priority}; "
                             "policy accept;", [f"tcp dport {ports} {action}"]))
        g.tables.append(table)


def _ipt_invalid_drop(g: _Gen) -> None:
    """iptables raw PREROUTING drops INVALID (before conntrack: everything)."""
    backend = g.rng.choice(("nft", "legacy"))
    g.save(backend, "raw").rules.append("-A PREROUTING -m conntrack --ctstate INVALID -j DROP")


def _ipt_notrack_stateful(g: _Gen) -> None:
    """iptables raw notrack on the range, filter INPUT DROP accepting NEW only."""
    backend = g.rng.choice(("nft", "legacy"))
    target = g.rng.choice(("CT --notrack", "NOTRACK"))
    g.save(backend, "raw").rules.append(
        f"-A PREROUTING -p tcp -m tcp --dport {RANGE[0]}:{RANGE[1]} -j {target}")
    filt = g.save(backend, "filter")
    filt.chains["INPUT"] = "DROP"
    filt.rules += ["-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                   f"-A INPUT -p tcp -m multiport --dports {RENDEZVOUS},{RANGE[0]}:{RANGE[1]} "
                   "-m conntrack --ctstate NEW -j ACCEPT"]


def _ipt_policy_only(g: _Gen) -> None:
    """iptables filter INPUT with a DROP policy and no rule at all."""
    g.save(g.rng.choice(("nft", "legacy")), "filter").chains["INPUT"] = "DROP"


def _tie_notrack(g: _Gen) -> None:
    """notrack in one base chain, a ``ct state`` test in another at the same raw priority:
    which runs first decides the state. The notrack is iptables-legacy's raw table or an
    nft table; the legacy table is registered before the nft tables (the harness loads it
    first), an nft table in the order the script lists it."""
    ports = _ports_text(g)
    state = g.rng.choice(("untracked", "invalid"))
    verdict = g.rng.choice(("drop", "reject"))
    tester = _Table("inet", g.name("tie"))
    tester.chains.append(("raw", "type filter hook prerouting priority -300; policy accept;",
                          [f"ct state {state} tcp dport {ports} {verdict}"]))
    if g.chance(0.5):
        g.save("legacy", "raw").rules.append(
            f"-A PREROUTING -p tcp -m tcp --dport {ports.replace('-', ':')} -j CT --notrack")
        g.tables.append(tester)
        return
    tracker = _Table("inet", g.name("tie"))
    tracker.chains.append(("raw", "type filter hook prerouting priority -300; "
                           "policy accept;", [f"tcp dport {ports} notrack"]))
    g.tables += g.rng.sample([tester, tracker], 2)


PATTERNS: dict[str, Callable[[_Gen], None]] = {
    "invalid drop before conntrack": _invalid_drop,
    "new accept before conntrack, then reject": _new_accept_reject,
    "notrack, then stateful input": _notrack_stateful,
    "notrack, then untracked accept": _notrack_untracked,
    "new drop before conntrack": _new_drop_raw,
    "ct state at ingress": _ingress_state,
    "drop and reject at equal priority": _equal_priority,
    "iptables raw INVALID drop": _ipt_invalid_drop,
    "iptables raw notrack, then stateful INPUT": _ipt_notrack_stateful,
    "iptables policy drop without rules": _ipt_policy_only,
    "notrack and ct state at equal raw priority": _tie_notrack,
}
"""Patterns a case may hold: hardening rules whose verdict depends on where conntrack runs
or on the order of equal-priority base chains, and a policy that drops on its own."""


def generate(seed: int, net: Net, size: Size = SMALL) -> Case:
    """The case of ``seed``: the same seed, net and size always give the same case."""
    g = _Gen(seed, net, size)
    rng = g.rng
    pick = rng.random()
    nft = pick < 0.7 or pick >= 0.9
    nft_tables = 0.45 <= pick < 0.6 or 0.7 <= pick < 0.8 or pick >= 0.9
    legacy = 0.6 <= pick < 0.7 or pick >= 0.8
    if nft:
        g.tables += [g.nft_table() for _ in range(rng.randint(1, size.tables))]
    for backend, wanted in (("nft", nft_tables), ("legacy", legacy)):
        if wanted:
            g.iptables(backend)
    pattern = ""
    if rng.random() < 0.4:
        pattern = rng.choice(sorted(PATTERNS))
        PATTERNS[pattern](g)
        if rng.random() < 0.5 and g.tables:
            g.tables.insert(0, g.tables.pop())
    return Case(seed, "".join(t.text() + "\n" for t in g.tables), g.save_text("nft"),
                g.save_text("legacy"), tuple(g.sources), g.probes(), pattern)
