"""Added latency between the controller and the bench lab's nodes, RTT measurement, and the
per-host cost breakdown of a drift check (connection setup, facts round trip, controller CPU).
"""

from __future__ import annotations

import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import paramiko
from common import BENCH_LAB, ROOT, log

from gpufleet import roles as role_registry
from gpufleet.connect.connection import ConnectOptions
from gpufleet.connect.ssh import SSHConnection
from gpufleet.facts import catalog, script
from gpufleet.facts.gather import gather_facts, parse_sections
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host, Inventory
from gpufleet.provision.engine import active_roles, fact_request, plan_host

TABLE = f"{BENCH_LAB.name}_delay"
RELAY_PORT = 47022
BYPASS_MARK = 0x6662  # the relay's own connections to the nodes (bench/delay_relay.py)


@contextmanager
def added_latency(one_way_ms: float) -> Iterator[None]:
    """Delay SSH to the bench lab by ``one_way_ms`` each way (see bench/delay_relay.py).

    Only the bench lab's subnet, port 22, from this machine's own output path is
    redirected; the nftables table and the relay are removed afterwards.
    """
    relay = subprocess.Popen([sys.executable, str(ROOT / "bench" / "delay_relay.py"), "--port",
                              str(RELAY_PORT), "--one-way-ms", str(one_way_ms)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert relay.stdout is not None
        relay.stdout.readline()  # "relay listening ..."
        rules = (f"table ip {TABLE} {{\n chain output {{\n"
                 "  type nat hook output priority -100; policy accept;\n"
                 f"  ip daddr {BENCH_LAB.subnet}.0/24 tcp dport 22 meta mark != {BYPASS_MARK:#x}"
                 f" redirect to :{RELAY_PORT}\n }}\n}}\n")
        subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "ip", TABLE], capture_output=True,
                       check=False)
        relay.terminate()
        relay.wait(timeout=10)


def ssh_rtt_ms(host: Host, base: Path, samples: int = 15) -> dict[str, float]:
    """RTT as SSH sees it: one global request with a reply (one round trip) on an open
    connection; also the time to open and authenticate the connection."""
    conn = SSHConnection(host, ConnectOptions(known_hosts_base=base))
    start = time.monotonic()
    conn.connect()
    connect_s = time.monotonic() - start
    transport = conn._connection().client.get_transport()
    assert transport is not None
    rtts = []
    for _ in range(samples):
        t = time.monotonic()
        transport.global_request("keepalive@openssh.com", wait=True)
        rtts.append(time.monotonic() - t)
    conn.close()
    return {"rtt_ms": round(statistics.median(rtts) * 1000, 2),
            "connect_ms": round(connect_s * 1000, 1)}


def icmp_rtt_ms(address: str) -> float | None:
    """ping's average RTT (ICMP bypasses the TCP relay: shows the link without it)."""
    out = subprocess.run(["ping", "-c", "5", "-i", "0.2", "-q", address], capture_output=True,
                         text=True, check=False).stdout
    for line in out.splitlines():
        if line.startswith("rtt"):
            return float(line.split("=")[1].split("/")[1])
    return None


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _request(host: Host) -> Any:
    pairs = active_roles(host, role_registry.ALL)
    return pairs, fact_request(pairs) | role_registry.consistency_request(host)


def sequential_costs(inventory: Inventory, hosts: list[Host]) -> dict[str, Any]:
    """Per-host wall and controller CPU of each phase, hosts one after another (no
    contention): connect+auth, the facts round trip, parsing its output, planning."""
    base = inventory.path
    phases: dict[str, list[float]] = {k: [] for k in (
        "connect_wall", "connect_cpu", "facts_wall", "facts_cpu", "parse_cpu", "plan_cpu")}
    sizes = []
    for host in hosts:
        pairs, request = _request(host)
        facts_list = catalog.BASE_FACTS + request.facts()
        nonce = script.new_nonce()
        composite = script.compose(((f.name, f.shell) for f in facts_list), nonce)
        conn = SSHConnection(host, ConnectOptions(known_hosts_base=base))
        c0, t0 = _cpu(), time.monotonic()
        conn.connect()
        c1, t1 = _cpu(), time.monotonic()
        result = conn.run(composite, timeout=90)  # what gather_facts sends, one round trip
        c2, t2 = _cpu(), time.monotonic()
        facts = parse_sections(host.name, result.stdout, facts_list, nonce)
        c3 = _cpu()
        plan_host(inventory, host, pairs, facts)
        c4 = _cpu()
        conn.close()
        sizes.append(len(result.stdout))
        for key, value in (("connect_wall", t1 - t0), ("connect_cpu", c1 - c0),
                           ("facts_wall", t2 - t1), ("facts_cpu", c2 - c1),
                           ("parse_cpu", c3 - c2), ("plan_cpu", c4 - c3)):
            phases[key].append(value)
    costs: dict[str, Any] = {k: round(statistics.median(v) * 1000, 2)
                             for k, v in phases.items()}
    costs["unit"] = "ms per host (median)"
    costs["facts_output_bytes"] = int(statistics.median(sizes))
    return costs


def facts_script_on_node(inventory: Inventory, host: Host) -> float:
    """Wall time of the composite facts script run inside the node directly (no SSH)."""
    from common import bench_lab

    _, request = _request(host)
    facts = catalog.BASE_FACTS + request.facts()
    composite = script.compose((f.name, f.shell) for f in facts)
    argv = bench_lab().exec_argv(host.name, composite)
    times = []
    for _ in range(3):
        start = time.monotonic()
        subprocess.run(argv, capture_output=True, check=True)
        times.append(time.monotonic() - start)
    return round(statistics.median(times) * 1000, 1)


def parallel_check(inventory: Inventory, hosts: list[Host]) -> dict[str, Any]:
    """What `invoke drift` does per host, all hosts at once as the engine fans out (one
    thread per host), timed per phase inside the process; CPU from getrusage."""
    base = inventory.path

    def one(host: Host) -> tuple[float, float, float]:
        pairs, request = _request(host)
        conn = SSHConnection(host, ConnectOptions(known_hosts_base=base))
        t0 = time.monotonic()
        conn.connect()
        t1 = time.monotonic()
        facts = gather_facts(conn, request)
        t2 = time.monotonic()
        plan_host(inventory, host, pairs, facts)
        conn.close()
        return t1 - t0, t2 - t1, time.monotonic() - t0

    c0, t0 = _cpu(), time.monotonic()
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        results = list(pool.map(one, hosts))
    wall, cpu = time.monotonic() - t0, _cpu() - c0
    connect, facts_rt, total = zip(*results, strict=True)
    return {"hosts": len(hosts), "wall_s": round(wall, 3), "controller_cpu_s": round(cpu, 3),
            "connect_s_median": round(statistics.median(connect), 3),
            "facts_s_median": round(statistics.median(facts_rt), 3),
            "host_total_s_median": round(statistics.median(total), 3),
            "host_total_s_max": round(max(total), 3)}


def known_hosts_cost(known_hosts: Path, entries: int) -> float:
    """CPU ms that paramiko spends loading a known_hosts file of ``entries`` lines, as
    gpufleet does once per connection."""
    first = known_hosts.read_text().splitlines()[0].split()
    path = known_hosts.with_name(f"known_hosts.{entries}")
    path.write_text("".join(f"10.{100 + i // 250}.{i % 250}.1 {first[1]} {first[2]}\n"
                            for i in range(entries)))
    start = _cpu()
    for _ in range(5):
        paramiko.SSHClient().load_host_keys(str(path))
    path.unlink()
    return round((_cpu() - start) / 5 * 1000, 2)


def padded_inventory(inventory_dir: Path, entries: int) -> Path:
    """A copy of the bench inventory whose known_hosts also lists ``entries`` other hosts
    (a big fleet's known_hosts), to measure what its size costs per connection."""
    import shutil

    import yaml

    target = inventory_dir.parent / f"lab-kh{entries}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(inventory_dir / "group_vars", target / "group_vars")
    doc = yaml.safe_load((inventory_dir / "hosts.yml").read_text())
    real = Path(doc["all"]["vars"]["gpufleet_known_hosts"])
    lines = real.read_text().splitlines()
    key = lines[0].split()
    extra = [f"10.{100 + i // 250}.{i % 250}.1 {key[1]} {key[2]}"
             for i in range(max(0, entries - len(lines)))]
    padded = target / "known_hosts.padded"
    padded.write_text("\n".join(extra + lines) + "\n")
    doc["all"]["vars"]["gpufleet_known_hosts"] = str(padded)
    (target / "hosts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


def breakdown(inventory_dir: Path, nodes: int) -> dict[str, Any]:
    """Where one drift check's time goes, per host and in parallel."""
    inventory = load_inventory(inventory_dir)
    hosts = inventory.select(":".join(f"node{i:02d}" for i in range(1, nodes + 1)))
    log(f"breakdown on {nodes} hosts: sequential phases")
    result: dict[str, Any] = {"sequential": sequential_costs(inventory, hosts)}
    result["facts_script_in_node_ms"] = facts_script_on_node(inventory, hosts[0])
    log("breakdown: parallel (engine-style fan-out, in process)")
    result["parallel"] = parallel_check(inventory, hosts)
    return result


def rtt_report(inventory_dir: Path) -> dict[str, Any]:
    inventory = load_inventory(inventory_dir)
    host = inventory.hosts["node01"]
    return {"ssh": ssh_rtt_ms(host, inventory.path), "icmp_ms": icmp_rtt_ms(host.address),
            "host": host.name, "how": shlex.join(["ssh global request", "keepalive@openssh.com"])}
