"""Time the whole-range firewall analysis on a big live ruleset (run as root).

Renders gpufleet's nftables ruleset for a 1,000-node cluster (roles/firewall.py, sources
10.20.x.y with gaps, so nft keeps 1,000 set elements), adds foreign tables of the kind a
real node carries (a fail2ban-like ban set of 3,000 addresses, a kube-proxy-like table
with 400 per-port rules and a jump chain, a policy-drop hardening table with a 200-port
hole, an interval verdict map of 200 entries, a rate limit), loads it all with the real
nft into a network namespace (gfnft-bench), saves ``nft -j list ruleset``, deletes the
namespace, and times parse + analysis of 29500 and 49152-65535 for the 1,000 sources.

A second case puts one rule per source (``ip saddr X tcp dport Y drop``, 1,000 rules,
each source and port different) in front: every source is its own group, the worst case
for the grouping.

    sudo .venv/bin/python bench/firewall_analysis.py [--runs 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from gpufleet.facts.gather import Facts
from gpufleet.firewall_analysis import analyse, parse_nft
from gpufleet.inventory.load import load_inventory
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles.firewall import ROLE

NODES = 1000
PORTS = [(29500, 29500), (49152, 65535)]
NAMESPACE = "gfnft-bench"


def cluster() -> list[str]:
    return [f"10.20.{i // 120}.{2 * (i % 120) + 1}" for i in range(NODES)]


def gpufleet_ruleset(work: Path, sources: list[str]) -> str:
    hosts = "".join(f"    node{i:04d}:\n      ansible_host: {a}\n" for i, a in enumerate(sources))
    path = work / "hosts.yml"
    path.write_text(f"all:\n  vars:\n    firewall_enabled: true\n  hosts:\n{hosts}")
    inventory = load_inventory(path)
    host = inventory.hosts["node0000"]
    return ROLE.render(Facts("node0000", values={"ssh_client": "172.16.0.5"}),
                       RoleVars(host, ROLE.defaults), PlanContext(inventory, host))


def foreign_tables(sources: list[str]) -> str:
    rng = random.Random(18)
    banned = {f"100.{rng.randrange(64, 128)}.{rng.randrange(256)}.{rng.randrange(256)}"
              for _ in range(3000)} | {sources[17], sources[503]}
    kube_rules = "\n".join(f"\t\ttcp dport {30000 + i} ip saddr 10.244.0.0/16 accept"
                           for i in range(200))
    services = "\n".join(f"\t\ttcp dport {50000 + 10 * i} ip saddr 10.96.0.0/12 counter accept"
                         for i in range(200))
    vmap = ", ".join(f"{40000 + 100 * i}-{40000 + 100 * i + 49} : accept" for i in range(199))
    return f"""
table inet f2b {{
	set banned {{ type ipv4_addr; flags interval; elements = {{ {", ".join(sorted(banned))} }} }}
	chain input {{ type filter hook input priority filter - 1; policy accept;
		ip saddr @banned drop
	}}
}}
table ip kube {{
	chain services {{
{services}
	}}
	chain input {{ type filter hook input priority filter - 5; policy accept;
		ct state established,related accept
{kube_rules}
		ip saddr 10.96.0.0/12 jump services
	}}
}}
table inet hardening {{
	chain input {{ type filter hook input priority filter + 10; policy drop;
		ct state established,related accept
		iifname "lo" accept
		tcp dport 22 accept
		tcp dport 52000-52199 drop
		tcp dport {{ 29500, 49152-65535 }} ip saddr 10.20.0.0/16 accept
	}}
}}
table inet vmaps {{
	map ports {{ type inet_service : verdict; flags interval;
		elements = {{ {vmap}, 61000-61009 : drop }} }}
	chain input {{ type filter hook input priority filter - 20; policy accept;
		tcp dport vmap @ports
	}}
}}
table inet ratelimit {{
	chain input {{ type filter hook input priority filter - 30; policy accept;
		tcp dport 29500 ct state new limit rate over 100/second drop
	}}
}}
"""


def per_source_table(sources: list[str]) -> str:
    rules = "\n".join(f"\t\tip saddr {a} tcp dport {50000 + 7 * i} drop"
                      for i, a in enumerate(sources))
    return f"""
table ip persource {{
	chain input {{ type filter hook input priority filter - 40; policy accept;
{rules}
	}}
}}
"""


def live_json(rulesets: list[str], work: Path) -> str:
    """Load the rulesets into a fresh namespace with the real nft; its JSON listing."""
    subprocess.run(["ip", "netns", "add", NAMESPACE], check=True)
    try:
        for index, text in enumerate(rulesets):
            path = work / f"ruleset{index}.nft"
            path.write_text(text)
            subprocess.run(["ip", "netns", "exec", NAMESPACE, "nft", "-f", str(path)],
                           check=True)
        return subprocess.run(["ip", "netns", "exec", NAMESPACE, "nft", "-j", "list",
                               "ruleset"], check=True, capture_output=True, text=True).stdout
    finally:
        subprocess.run(["ip", "netns", "del", NAMESPACE], check=True)


def measure(name: str, text: str, sources: list[str], runs: int) -> None:
    parse_s, analyse_s = [], []
    for _ in range(runs):
        start = time.perf_counter()
        ruleset = parse_nft(text)
        parsed = time.perf_counter()
        analysis = analyse([ruleset], sources, PORTS, iif="eth0")
        parse_s.append(parsed - start)
        analyse_s.append(time.perf_counter() - parsed)
    rules = sum(len(c.rules) for t in ruleset.tables for c in t.chains.values())
    print(f"{name}: {len(text) / 1e6:.1f} MB of JSON, {len(ruleset.tables)} tables, "
          f"{rules} rules; {len(sources)} sources x {sum(h - lo + 1 for lo, h in PORTS)} ports")
    print(f"  parse   median {statistics.median(parse_s) * 1e3:.0f} ms "
          f"(min {min(parse_s) * 1e3:.0f}, max {max(parse_s) * 1e3:.0f})")
    print(f"  analyse median {statistics.median(analyse_s) * 1e3:.0f} ms "
          f"(min {min(analyse_s) * 1e3:.0f}, max {max(analyse_s) * 1e3:.0f}); "
          f"{len(analysis.blocked)} blocked, {len(analysis.uncertain)} uncertain, "
          f"{len(analysis.accepted)} accepted findings")
    for message in analysis.messages()[:4]:
        print(f"    {message[:150]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    sources = cluster()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = [gpufleet_ruleset(work, sources), foreign_tables(sources)]
        measure("realistic", live_json(base, work), sources, args.runs)
        measure("one rule per source", live_json([*base, per_source_table(sources)], work),
                sources, args.runs)


if __name__ == "__main__":
    main()
