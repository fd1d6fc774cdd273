"""Documents for the HTML report's tests, made by gpufleet's own code: synthetic fleets of
any size (results, verdicts and thermal curves built with the classes and functions the
checks use), and documents from a real 2x H200 machine (tests/fixtures/h200x2)."""

from __future__ import annotations

import csv
import json
import math
import random
from typing import Any

from gpufleet.conformance.results import ConformanceReport, Result
from gpufleet.conformance.verdict import Figure, Gate, Verdict, failures, properties
from gpufleet.drift.compare import DriftItem, HostDrift, Inconsistency
from gpufleet.drift.report import to_json as drift_json
from gpufleet.drift.run import DriftRun
from gpufleet.suites.probes.thermal import thermal_verdict
from gpufleet.suites.test_thermal import curves, mirror_windows
from tests.conftest import FIXTURES

SIZES = [2**20, 2**24, 2**28, 2**30, 2**32, 2**33]
H200_BUSBW = [39.4, 222.6, 300.0, 329.7, 344.8, 346.8]  # the real node alone, GB/s
FLOOR_GBPS = 315.0
HOSTILE = '<img src=x onerror="alert(1)">node&"x"'
HOSTILE_MESSAGE = "</td></tr><script>alert('pwned')</script><b onmouseover=alert(2)>bold</b>"


def host_names(count: int) -> list[str]:
    return [f"node{i:04d}" for i in range(1, count + 1)]


def busbw_verdicts(rng: random.Random, factor: float, trials: int = 5,
                   baseline: bool = True) -> dict[str, Verdict]:
    """A node's single-node AllReduce verdicts per size, the floor at the largest size and a
    baseline 2% above the fleet's curve."""
    out = {}
    for size, busbw in zip(SIZES, H200_BUSBW, strict=True):
        name = f"allreduce.busbw.{size}"
        floor = FLOOR_GBPS if size == SIZES[-1] else None
        values = [busbw * factor * rng.uniform(0.97, 1.03) for _ in range(trials)]
        base = round(busbw * 1.02, 1) if baseline else None
        out[name] = Verdict(Figure(name, "GB/s", floor), values, Gate.of(floor, base, 0.9))
    return out


def soak_samples(rng: random.Random, gpus: int, seconds: int, mirrored: bool
                 ) -> list[dict[str, Any]]:
    """Thermal probe samples, one a second: clocks fall from boost to the power cap in the
    first seconds; a mirrored GPU 0 then heats up while its clock falls."""
    samples = []
    for t in range(seconds):
        for gpu in range(gpus):
            warm = 1 - math.exp(-t / 20)
            temp = 35 + 27 * warm + rng.uniform(-0.5, 0.5)
            clock = 1980.0 if t < 2 else 1440.0 + rng.choice((0, 15, 30))
            if mirrored and gpu == 0 and t > 15:
                temp += 30 * (t - 15) / seconds
                clock -= 300 * (t - 15) / seconds
            samples.append({"t": float(t), "gpu": gpu, "temp_c": round(temp),
                            "power_w": round(690 + rng.uniform(-15, 10), 1), "sm_mhz": clock,
                            "reasons": 4, "hw_thermal": False, "hw_power_brake": False,
                            "sw_thermal": False})
    return samples


def soak(rng: random.Random, gpus: int, seconds: int, mirrored: bool
         ) -> tuple[list[dict[str, Any]], list[str], dict[str, Any]]:
    """A soak's samples, the verdict's problems, and what the check keeps in the data."""
    samples = soak_samples(rng, gpus, seconds, mirrored)
    kept = {"summary": {"tflops_per_gpu": [660.0] * gpus}, "files": [],
            "curves": curves(samples), "mirror": mirror_windows(samples, -0.8, 0.05, 15.0),
            "max_temp_c": 85.0, "mirror_threshold": -0.8, "min_clock_drop": 0.05,
            "warmup_s": 15.0}
    return samples, thermal_verdict(samples, 85.0), kept


def synthetic_conformance(count: int = 1000, *, gpus: int = 2, seconds: int = 120,
                          hostile: bool = False, seed: int = 7) -> dict[str, Any]:
    """A conformance run over ``count`` nodes: stack, firewall, gpu, allreduce (alone and
    across nodes), storage and thermal; about 2% of the nodes fail something, a few are
    unreachable; ``hostile`` adds a node whose name and messages are markup."""
    rng = random.Random(seed)
    hosts = host_names(count)
    if hostile:
        hosts[1] = HOSTILE
    report = ConformanceReport("inventory/prod", "f" * 64, 1.7e9, 1234.5)
    slow = set(hosts[9::97])
    hot = set(hosts[13::211])
    down = set(hosts[-3:])
    skewed, thin = hosts[min(40, count // 2)], hosts[min(77, count // 3)]
    storage_need = 1200.0
    soaks: dict[str, tuple[list[dict[str, Any]], list[str], dict[str, Any]]] = {}
    add = report.results.append
    for host in hosts:
        if host in down:
            for suite, check in (("stack", "test_role_converged[driver]"),
                                 ("allreduce", "test_each_node_alone"),
                                 ("thermal", "test_thermal_soak")):
                add(Result(suite, check, host, "fail", "unreachable or facts failed: "
                           "unreachable: connect timed out after 10s", 0.0, {}))
            continue
        add(Result("stack", "test_role_converged[driver]", host, "pass", "", 0.1,
                   {"items": []}))
        if host == skewed:
            add(Result("stack", "test_role_converged[nccl]", host, "fail",
                       "package libnccl2: 2.23.4-1+cuda12.6 (wants 2.21.5-1+cuda12.4)", 0.1,
                       {"items": ["nccl/package libnccl2"]}))
        else:
            add(Result("stack", "test_role_converged[nccl]", host, "pass", "", 0.1, {}))
        add(Result("firewall", "test_live_rules_admit_the_cluster", host,
                   "fail" if host == HOSTILE else "pass",
                   HOSTILE_MESSAGE if host == HOSTILE else "", 0.2, {}))
        add(Result("rdma", "test_roce_qos", host, "skip",
                   "no RDMA devices (/sys/class/infiniband is empty)", 0.0, {}))
        verdicts = busbw_verdicts(rng, 0.6 if host in slow else 1.0)
        problems = failures(verdicts)
        add(Result("allreduce", "test_each_node_alone", host, "fail" if problems else "pass",
                   "NVIDIA H200 x1 node: " + "; ".join(problems) if problems else "", 12.0,
                   {"largest_size": SIZES[-1], "world_size": 8,
                    "busbw_gbps": round(verdicts[f"allreduce.busbw.{SIZES[-1]}"].median, 1),
                    "verdicts": properties(verdicts)}))
        read = storage_need * rng.uniform(1.05, 1.4) * (0.5 if host == thin else 1)
        add(Result("storage", "test_storage_throughput", host,
                   "fail" if read < storage_need else "pass",
                   f"sequential reads at {read:.0f} MB/s (with {count - 1} nodes reading at "
                   f"once), training needs {storage_need:g} MB/s per node"
                   if read < storage_need else "", 30.0,
                   {"seq_read_mbps": round(read, 1), "need_mbps": storage_need,
                    "read_together_with": count - 1}))
        key = host if host in hot else ""  # the healthy nodes share one soak
        if key not in soaks:
            soaks[key] = soak(rng, gpus, seconds, host in hot)
        samples, problems, kept = soaks[key]
        report.data.setdefault("thermal", {})[host] = kept
        add(Result("thermal", "test_thermal_soak", host, "fail" if problems else "pass",
                   "; ".join(problems), float(seconds),
                   {"max_temp_c": max(s["temp_c"] for s in samples), "temp_limit_c": 85.0}))
    ran = [h for h in hosts if h not in down and h not in slow]
    together = [{"size": s, "busbw": b * 0.55, "world_size": 8 * len(ran)}
                for s, b in zip(SIZES, H200_BUSBW, strict=True)]
    report.data.setdefault("allreduce", {})["all nodes"] = {"nodes": ran, "results": together}
    report.data["allreduce"]["hierarchy"] = {"pairs": [
        {"nodes": ran[i:i + 2], "results": [{"size": s, "busbw": b * rng.uniform(0.6, 0.7),
                                             "world_size": 16}
                                            for s, b in zip(SIZES, H200_BUSBW, strict=True)]}
        for i in range(0, min(len(ran) - 1, 40), 2)]}
    report.results.append(Result("allreduce", "test_all_nodes_together", "fleet", "pass", "",
                                 80.0, {"busbw_gbps": round(H200_BUSBW[-1] * 0.55, 1),
                                        "largest_size": SIZES[-1], "world_size": 8 * len(ran),
                                        "gate_gbps": 180.0,
                                        "left_out": sorted(slow | down)}))
    report.results.append(Result("storage", "test_storage_aggregate", "fleet", "pass", "", 1.0,
                                 {"aggregate_mbps": round(storage_need * count * 1.1, 1),
                                  "nodes": count - len(down), "need_mbps": storage_need * count}))
    report.data["stack"] = {"versions": {h: {"kernel": "6.8.0-45-generic",
                                             "driver": "580.95.05", "cuda": "12.4",
                                             "nccl": "2.21.5-1+cuda12.4", "torch": "2.13.0"}
                                         for h in hosts if h not in down}}
    if skewed not in down:
        report.data["stack"]["versions"][skewed]["nccl"] = "2.23.4-1+cuda12.6"
    return report.to_json()


def h200_samples(name: str = "thermal.csv") -> list[dict[str, Any]]:
    """The thermal probe's samples of a real 2x H200 soak."""
    rows = list(csv.DictReader((FIXTURES / "h200x2" / "gpufleet" / name).open()))
    return [{"t": float(r["t"]), "gpu": int(r["gpu"]), "temp_c": float(r["temp_c"]),
             "power_w": float(r["power_w"]), "sm_mhz": float(r["sm_mhz"]),
             "reasons": int(r["reasons"]), "hw_thermal": r["hw_thermal"] == "True",
             "hw_power_brake": r["hw_power_brake"] == "True",
             "sw_thermal": r["sw_thermal"] == "True"} for r in rows]


def h200_conformance() -> dict[str, Any]:
    """The conformance report of a real 2x H200 node (acceptance suites included), with the
    curves of that run's soak in its data as the thermal check now keeps them. That run
    judged the clock from t=0 (before the warm-up was left out), so its window starts at 0."""
    doc: dict[str, Any] = json.loads((FIXTURES / "h200x2" / "gpufleet" / "conformance.json")
                                     .read_text())
    samples = h200_samples()
    doc["data"]["thermal"] = {"gpu-local": {
        "curves": curves(samples), "mirror": mirror_windows(samples, -0.8, 0.05, 0.0),
        "max_temp_c": 85.0, "mirror_threshold": -0.8, "min_clock_drop": 0.05,
        "warmup_s": 0.0}}
    return doc


def synthetic_drift(count: int = 1000, runs: int = 6, *, hostile: bool = False
                    ) -> list[dict[str, Any]]:
    """``runs`` drift runs over ``count`` hosts, oldest first: a libnccl2 skew spreads over
    more hosts run by run, one host is unreachable, one has a hung nvidia-smi."""
    hosts = host_names(count)
    if hostile:
        hosts[1] = HOSTILE
    documents = []
    for run in range(runs):
        drift: dict[str, HostDrift] = {}
        for i, host in enumerate(hosts):
            if host == hosts[-1]:
                drift[host] = HostDrift(host, "unreachable",
                                        error="connect timed out after 10s"
                                        if host != HOSTILE else HOSTILE_MESSAGE)
                continue
            items = []
            if i % 50 < run:
                items.append(DriftItem(host, "nccl", "package libnccl2", "package",
                                       "2.21.5-1+cuda12.4", "2.23.4-1+cuda12.6",
                                       new=i % 50 == run - 1))
            if host in (hosts[1], hosts[5]):
                items.append(DriftItem(host, "nccl_env", "file /etc/nccl.conf", "file",
                                       "127 bytes", "140 bytes (differs)",
                                       diff="--- /etc/nccl.conf\n+++ /etc/nccl.conf\n"
                                            "-NCCL_DEBUG=WARN\n+NCCL_DEBUG=TRACE\n"
                                            + (f"+{HOSTILE_MESSAGE}\n" if hostile else "")))
            entry = HostDrift(host, "drifted" if items else "clean", items, duration=0.4,
                              round_trips=1)
            if i == 7:
                entry.timed_out = {"gpus": "nvidia-smi timed out after 20 s"}
            drift[host] = entry
        new = [f"{h} nccl/package libnccl2" for i, h in enumerate(hosts) if i % 50 == run - 1]
        inconsistencies = [Inconsistency("training", "nccl", {
            "2.21.5-1+cuda12.4": hosts[run + 2:], "2.23.4-1+cuda12.6": hosts[:run + 2]},
            "2.21.5-1+cuda12.4")] if run else []
        document = drift_json(DriftRun("inventory/prod", "d" * 64, drift, inconsistencies, new,
                                       [], 1.7e9 + run * 86400, 42.0, ["nccl", "nccl_env"]))
        document["started_at"] = f"2026-11-{20 + run:02d}T03:00:00Z"
        document["generated_at"] = f"2026-11-{20 + run:02d}T03:00:42Z"
        documents.append(document)
    return documents
