"""Inventory loading against ansible-inventory, in the same run: a generated inventory of
GROUPS x HOSTS hosts (7 variables each, group_vars in the shape of inventory/prod with
templated values, host_vars for one host of each group). Timed, alternating run by run,
each as a fresh process:

- gpufleet: what every command does before it contacts a host, ``load_target`` (load the
  inventory, select the hosts), then every variable of every host read, templates
  rendered (the process also reports its import, load and resolve phases);
- ``ansible-inventory -i DIR --list``;
- ``gpufleet inventory -i DIR --list`` (the same, printed as ansible-inventory prints it,
  with secrets redacted: the command's start-up and the JSON printing on top).

Run from the project root (no root needed once ansible-core is in the tools' venv):

    .venv/bin/python bench/inventory_load.py --runs 5 --results bench/results/inventory-load.json

Every run checks both listings: the same hosts and groups, and the same value for every
variable that holds no template. Target: gpufleet at most 0.1x of ansible-inventory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common import ROOT, TOOLS_VENV, ensure_tools, log

TARGET = 0.1
ANSIBLE_ENV = {"ANSIBLE_CONFIG": "", "ANSIBLE_LOCALHOST_WARNING": "False",
               "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False", "ANSIBLE_NOCOLOR": "1",
               "ANSIBLE_DEPRECATION_WARNINGS": "False"}

ALL_VARS = """\
# The pinned stack and the site, as inventory/prod/group_vars/all.yml, with the values
# sites usually derive from others written as templates.
site: atlas
domain: "{{ site }}.example.net"
ansible_user: "{{ admin_user | default('ops') }}"
ansible_become: true
ansible_ssh_common_args: "-o ProxyJump=ops@bastion.{{ domain }}"
gpufleet_known_hosts: known_hosts
node_fqdn: "{{ inventory_hostname }}.{{ domain }}"
bmc_url: "https://{{ bmc_address }}/redfish/v1/Systems/1"
slurm_node_name: "{{ inventory_hostname_short }}"

nvidia_driver_version: "550.127.05"
nvidia_driver_package: "nvidia-driver-{branch}"
nvidia_driver_package_version: "{version}-0ubuntu1"
cuda_version: "12.4.1"
nccl_version: "2.21.5"
pytorch_version: "2.5.1"
pytorch_cuda: "12.4"
pytorch_venv: /opt/gpufleet/venv
pytorch_index_url: "https://download.pytorch.org/whl/cu{{ pytorch_cuda | replace('.', '') }}"

nccl_socket_ifname: bond0
nccl_env:
  NCCL_SOCKET_IFNAME: "{{ nccl_socket_ifname }}"
  NCCL_IB_HCA: mlx5_0,mlx5_1,mlx5_4,mlx5_5
  NCCL_IB_GID_INDEX: 3
  NCCL_IB_TC: 106
  NCCL_DEBUG: WARN

firewall_enabled: true
firewall_backend: nftables
firewall_cluster_group: training
firewall_extra_cidrs: [10.20.0.0/28]
gpufleet_controllers: [10.20.0.5, 10.20.0.6]
firewall_policy: drop
rdma: {pfc_priority: 3, trust: dscp, ecn: true}
gpufleet_scheduler: slurm
"""

TRAINING_VARS = """\
# 8x H200 SXM per node, as inventory/prod/group_vars/h200.yml.
gpu_count: 8
gpu_model: NVIDIA H200
gpu_nvlink: true
gpu_pcie_gen: 5
gpu_pcie_width: 16
gpu_max_temp_c: 85
allreduce_sizes: "1M,16M,256M,1G,4G,8G"
allreduce_busbw_thresholds:
  NVIDIA H200: {1: 330, 2: 150}
p2p_min_gbps: {NVIDIA H200: 355}
h2d_min_gbps: {NVIDIA H200: 50}
ddp_min_efficiency: 0.85
ddp_width: 4096
thermal_seconds: 300
"""

HOST_VARS = """\
# Back from repair with a different NIC port for its first rail, as inventory/prod/host_vars.
nccl_env:
  NCCL_SOCKET_IFNAME: "{{ nccl_socket_ifname }}"
  NCCL_IB_HCA: mlx5_0,mlx5_1,mlx5_2,mlx5_5
  NCCL_IB_GID_INDEX: 3
  NCCL_IB_TC: 106
  NCCL_DEBUG: WARN
"""

# What a command does with the inventory before it contacts a host, phase by phase.
RESOLVE = """\
import json, sys, time
start = time.process_time()
from gpufleet.sources import load_target
imported = time.process_time()
target = load_target(sys.argv[1], None)
loaded = time.process_time()
values = sum(len([host.vars[key] for key in host.vars]) for host in target.hosts)
resolved = time.process_time()
print(json.dumps({"import_s": imported - start, "load_s": loaded - imported,
                  "resolve_s": resolved - loaded, "hosts": len(target.hosts),
                  "values": values}))
"""


def generate(directory: Path, groups: int, per_group: int) -> int:
    """Write the inventory: hosts.yml (one group per rack under ``training``, 7 variables
    per host, rack variables inline), group_vars/all.yml, group_vars/training.yml and
    host_vars/ for the eighth host of every rack."""
    for vars_dir in ("group_vars", "host_vars"):
        (directory / vars_dir).mkdir(parents=True, exist_ok=True)
    lines = ["all:", "  children:", "    training:", "      children:"]
    for rack in range(groups):
        lines += [f"        rack{rack:03d}:", "          vars:", f"            rack_id: {rack}",
                  f"            rack_row: {'ABCD'[rack % 4]}",
                  '            rack_leaf: "leaf{{ rack_id }}.{{ domain }}"', "          hosts:"]
        (directory / "host_vars" / f"gpu-r{rack:03d}-n007.yml").write_text(HOST_VARS)
        for node in range(per_group):
            index = rack * per_group + node
            a, b, c = index // 12500, index // 50 % 250, 10 + index % 50
            lines += [f"            gpu-r{rack:03d}-n{node:03d}:",
                      f"              ansible_host: 10.{100 + a}.{b}.{c}",
                      f"              bmc_address: 10.{200 + a}.{b}.{c}",
                      f"              node_index: {node}",
                      f'              serial_number: "SN{index:08d}"',
                      f'              ib_guids: ["0x98039b03{index:06x}00", '
                      f'"0x98039b03{index:06x}01"]',
                      "              nvme_devices: [nvme0n1, nvme1n1]",
                      f"              slurm_weight: {1 + node % 4}"]
    (directory / "hosts.yml").write_text("\n".join(lines) + "\n")
    (directory / "group_vars" / "all.yml").write_text(ALL_VARS)
    (directory / "group_vars" / "training.yml").write_text(TRAINING_VARS)
    return groups * per_group


@dataclass
class Run:
    """One timed listing: wall clock and CPU (user+sys) of the process."""

    tool: str
    run: int
    wall_s: float
    cpu_s: float
    loadavg_1m: float


def timed(tool: str, run: int, argv: list[str], output: Path, env: dict[str, str]) -> Run:
    """Run ``argv`` with its standard output in ``output``; fail on a non-zero exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with output.open("wb") as out:
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                              env={**os.environ, **env}, check=False)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{tool} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(tool, run, round(wall, 3), round(cpu, 3), round(os.getloadavg()[0], 2))


def _templated(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_templated(item) for item in value.values())
    if isinstance(value, list):
        return any(_templated(item) for item in value)
    return isinstance(value, str) and "{{" in value


def validate(gpufleet: Path, ansible: Path, hosts: int) -> None:
    """Both listings hold the same hosts and groups, and the same value for every variable
    without a template (gpufleet renders templates, ansible-inventory does not)."""
    ours, theirs = json.loads(gpufleet.read_text()), json.loads(ansible.read_text())
    names = set(theirs["_meta"]["hostvars"])
    if set(ours["_meta"]["hostvars"]) != names or len(names) != hosts:
        raise SystemExit(f"host lists differ: {len(ours['_meta']['hostvars'])} from gpufleet, "
                         f"{len(names)} from ansible-inventory, {hosts} generated")
    if {k for k in ours if k != "_meta"} != {k for k in theirs if k != "_meta"}:
        raise SystemExit("group lists differ")
    for name in names:
        mine, expected = ours["_meta"]["hostvars"][name], theirs["_meta"]["hostvars"][name]
        if set(mine) != set(expected):
            raise SystemExit(f"{name}: variables differ: {sorted(set(mine) ^ set(expected))}")
        for key, value in expected.items():
            if not _templated(value) and mine[key] != value:
                raise SystemExit(f"{name}: {key} is {mine[key]!r}, ansible-inventory has "
                                 f"{value!r}")


def _median(runs: list[Run], tool: str, field: str) -> float:
    return round(float(statistics.median(getattr(r, field) for r in runs if r.tool == tool)), 3)


def table(summary: dict[str, Any]) -> str:
    """The results as Markdown."""
    rows = [f"| {TOOLS[tool]} | {summary[tool]['wall_s']} s | {summary[tool]['cpu_s']} s | "
            f"{summary['ratio'][tool]['wall']}x | {summary['ratio'][tool]['cpu']}x |"
            for tool in TOOLS]
    ph = summary["phases"]
    low, high = summary["loadavg_1m"]
    return "\n".join([
        f"# Inventory loading: {summary['hosts']:,} hosts", "",
        f"{summary['runs']} runs of each, alternating; medians. Load average (1 min) "
        f"{low}-{high} on {summary['cores']} cores.", "",
        "| | wall | CPU | wall vs ansible-inventory | CPU vs ansible-inventory |",
        "|---|---|---|---|---|", *rows, "",
        f"gpufleet's phases (CPU, median): import {ph['import_s']} s, load_target "
        f"{ph['load_s']} s, every variable of every host read {ph['resolve_s']} s "
        f"({ph['values']:,} values).", "",
        f"Target: gpufleet at most {TARGET}x of ansible-inventory (wall and CPU): "
        f"**{summary['target']}**.", ""])


TOOLS = {"gpufleet": "gpufleet: `load_target`, every variable read",
         "ansible-inventory": "`ansible-inventory -i DIR --list`",
         "gpufleet-list": "`gpufleet inventory -i DIR --list`"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--groups", type=int, default=100)
    p.add_argument("--hosts-per-group", type=int, default=100)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--results", type=Path, help="write the samples (JSON) and a .md table")
    p.add_argument("--keep", type=Path, help="generate the inventory here and keep it")
    args = p.parse_args(argv)
    versions = ensure_tools()
    env = {"PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory(prefix="gpufleet-inventory-bench-") as tmp:
        work = Path(tmp)
        directory = args.keep or work / "inventory"
        hosts = generate(directory, args.groups, args.hosts_per_group)
        log(f"generated {hosts} hosts in {directory}")
        commands = {
            "gpufleet": ([sys.executable, "-c", RESOLVE, str(directory)], env),
            "ansible-inventory": ([str(TOOLS_VENV / "bin" / "ansible-inventory"), "-i",
                                   str(directory), "--list"],
                                  {**ANSIBLE_ENV, "ANSIBLE_HOME": str(work / "ansible-home")}),
            "gpufleet-list": ([sys.executable, "-m", "gpufleet", "inventory", "-i",
                               str(directory), "--list"], env),
        }
        runs: list[Run] = []
        split: list[dict[str, Any]] = []
        for run in range(1, args.runs + 1):
            for tool in list(commands) if run % 2 else list(commands)[::-1]:
                command, tool_env = commands[tool]
                sample = timed(tool, run, command, work / f"{tool}.json", tool_env)
                runs.append(sample)
                log(f"run {run} {tool}: {sample.wall_s} s wall, {sample.cpu_s} s CPU, "
                    f"load {sample.loadavg_1m}")
            validate(work / "gpufleet-list.json", work / "ansible-inventory.json", hosts)
            split.append(json.loads((work / "gpufleet.json").read_text()))
            if split[-1]["hosts"] != hosts:
                raise SystemExit(f"gpufleet selected {split[-1]['hosts']} of {hosts} hosts")
    summary: dict[str, Any] = {
        "hosts": hosts, "runs": args.runs, "cores": os.cpu_count(),
        "machine": platform.platform(), "versions": versions,
        "loadavg_1m": [min(r.loadavg_1m for r in runs), max(r.loadavg_1m for r in runs)],
    }
    for tool in TOOLS:
        summary[tool] = {field: _median(runs, tool, field) for field in ("wall_s", "cpu_s")}
    anchor = summary["ansible-inventory"]
    summary["ratio"] = {tool: {"wall": round(summary[tool]["wall_s"] / anchor["wall_s"], 3),
                               "cpu": round(summary[tool]["cpu_s"] / anchor["cpu_s"], 3)}
                        for tool in TOOLS}
    summary["phases"] = {key: round(float(statistics.median(s[key] for s in split)), 3)
                         if key.endswith("_s") else split[0][key] for key in split[0]}
    met = max(summary["ratio"]["gpufleet"].values()) <= TARGET
    summary["target"] = "met" if met else "not met"
    print(table(summary))
    if args.results:
        doc = {"summary": summary, "samples": [asdict(r) for r in runs], "phases": split}
        args.results.write_text(json.dumps(doc, indent=1) + "\n")
        args.results.with_suffix(".md").write_text(table(summary))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
