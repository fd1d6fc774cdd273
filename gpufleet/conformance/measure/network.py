"""Network placement between nodes: no routed hop, the path MTU, round-trip time and
jitter, measured with ping from every source of the reachability plan to its targets
(``checks/network.py`` judges them).

Per (source, target) pair, on the source, 32 targets at a time:

- **hop**: an echo with TTL 1 (``ping -t 1``) arrives only when no router is between the
  two (a router drops it and answers "Time to live exceeded");
- **MTU**: an echo of ``mtu - 28`` bytes with don't-fragment (``ping -M do``) arrives only
  when every link of the path carries ``mtu``-byte packets;
- **RTT and jitter**: ``ping -c N -i 0.05``: the minimum round trip (the path's distance)
  and the spread between the 10th and the 90th percentile of the round trips (its
  jitter; one slow echo of ten, such as the first one's neighbour lookup, does not count).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from gpufleet.conformance import nic_counters
from gpufleet.conformance.checks.network import PairResult, Placement
from gpufleet.conformance.measure.reachability import pairs
from gpufleet.conformance.session import ConformanceSession, Node
from gpufleet.conformance.suites.network import NetworkSettings
from gpufleet.connect.connection import node_local
from gpufleet.errors import GpufleetError

IP_HEADERS = 28  # IPv4 (20) and ICMP (8) headers around ping's payload
PARALLEL_TARGETS = 32  # targets one source pings at once
_TIME = re.compile(r"\btime[=<]([\d.]+) ms")
_RECEIVED = re.compile(r"(\d+) packets transmitted, (\d+) (?:packets )?received")
_ADDRESS = re.compile(r"^[0-9A-Fa-f:.]+\Z")


def parse_ping(text: str) -> tuple[int, int, float | None, float | None]:
    """(sent, received, minimum RTT in µs, jitter in µs) from ping's output: jitter is the
    spread between the 10th and the 90th percentile of the echoes' round trips."""
    counts = _RECEIVED.search(text)
    sent, received = (int(counts.group(1)), int(counts.group(2))) if counts else (0, 0)
    times = sorted(float(t) * 1000 for t in _TIME.findall(text))
    if not times:
        return sent, received, None, None
    low, high = times[int(0.1 * (len(times) - 1))], times[round(0.9 * (len(times) - 1))]
    return sent, received, times[0], high - low


def parse_line(line: str) -> tuple[str, PairResult]:
    """One target's line of the source's script: address, hop, MTU, DF status, summary."""
    fields = line.split("\t")
    if len(fields) != 5 or not fields[2].isdigit():
        raise GpufleetError(f"unreadable ping line {line[:120]!r}")
    target, hop, mtu, df, summary = fields
    sent, received, rtt, jitter = parse_ping(summary.replace("|", "\n"))
    return target, PairResult(hop == "0", int(mtu), df == "0", received, sent, rtt, jitter)


def source_script(targets: Iterable[str], mtu: int | None, count: int) -> str:
    """Shell for one source: its targets pinged PARALLEL_TARGETS at a time, a tab-separated
    line each."""
    addresses = list(targets)
    bad = [a for a in addresses if not _ADDRESS.match(a)]
    if bad:
        raise GpufleetError(f"not an IP address: {bad[0]!r}")
    size = "" if mtu is None else str(mtu)
    return "\n".join([
        't=$(mktemp -d) || exit 1',
        "n=0",
        "trap 'rm -rf \"$t\"' EXIT",
        f"for a in {' '.join(addresses)}; do",
        "  (",
        f"    m={size}",
        '    if [ -z "$m" ]; then',
        '      d=$(ip -o route get "$a" 2>/dev/null | sed -n "s/.* dev \\([^ ]*\\).*/\\1/p")',
        '      m=$(cat "/sys/class/net/$d/mtu" 2>/dev/null || echo 1500)',
        "    fi",
        '    ping -n -c 1 -W 1 -t 1 "$a" > /dev/null 2>&1; h=$?',
        f'    ping -n -c 1 -W 1 -M do -s $((m - {IP_HEADERS})) "$a" > /dev/null 2>&1; f=$?',
        f'    s=$(ping -n -c {count} -i 0.05 -W 1 "$a" 2>&1 | tr "\\n" "|")',
        '    printf "%s\\t%s\\t%s\\t%s\\t%s\\n" "$a" "$h" "$m" "$f" "$s" > "$t/$a"',
        "  ) &",
        f'  n=$((n + 1)); [ $((n % {PARALLEL_TARGETS})) -eq 0 ] && wait',
        "done",
        "wait",
        'cat "$t"/* 2>/dev/null',
        "true",
    ])


def fleet_mtu(session: ConformanceSession) -> int | None:
    """``net_mtu`` where the inventory declares it (the first node's), else None: each
    source then uses its own interface's MTU toward the target."""
    first = next(iter(session.nodes.values()), None)
    return None if first is None else first.typed(NetworkSettings).net_mtu


def interface_mtu(node: Node) -> tuple[str, int] | None:
    """(interface, MTU) of the interface holding the node's inventory address; a name is
    resolved on the controller (nic_counters.resolve, bounded in time)."""
    given = node.host.address
    literal = nic_counters.address(given)
    wanted = {literal} if literal else set(nic_counters.resolve(given))
    for entry in (node.facts.get("interfaces") if node.facts else None) or []:
        if any(nic_counters.address(a.split("/")[0]) in wanted
               for a in entry.get("addresses") or []):
            return str(entry["name"]), int(entry["mtu"])
    return None


def common_mtu(session: ConformanceSession) -> int | None:
    """The MTU most nodes' inventory interfaces have."""
    found = Counter(m[1] for n in session.ready() if (m := interface_mtu(n)))
    return found.most_common(1)[0][0] if found else None


def measure(session: ConformanceSession, mode: str) -> Placement:
    """Ping every planned pair, every source at once (node-local: a source needs nothing
    from the others while it pings)."""
    nodes = {n.name: n for n in session.ready()}
    placement = Placement(mtu=fleet_mtu(session) or common_mtu(session))
    address = {n: str(node.host.vars.get("ansible_host") or n) for n, node in nodes.items()}
    by_address = {a: n for n, a in address.items()}
    targets: dict[str, list[str]] = {}
    for source, target in pairs(list(nodes), mode):
        targets.setdefault(source, []).append(address[target])

    def one(source: str) -> tuple[str, list[str] | str]:
        node = nodes[source]
        count = node.typed(NetworkSettings).net_ping_count
        try:
            script = source_script(targets[source], placement.mtu, count)
            with node_local():
                result = node.run(script, timeout=30 + 0.05 * count)
        except GpufleetError as exc:
            return source, str(exc)
        return source, result.stdout.splitlines()

    with ThreadPoolExecutor(max_workers=max(1, min(session.forks, len(targets)))) as pool:
        for source, lines in pool.map(one, list(targets)):
            if isinstance(lines, str):
                placement.errors[source] = lines
                continue
            for line in lines:
                try:
                    target, result = parse_line(line)
                except GpufleetError as exc:
                    placement.errors[source] = str(exc)
                    continue
                if target in by_address:
                    placement.results[(source, by_address[target])] = result
    return placement
