"""pyinfra inventory for the drift-check benchmark, read from gpufleet's (Ansible-format) lab
inventory so that all three tools target the same hosts with the same key and known_hosts.

Environment: BENCH_INVENTORY (gpufleet's hosts.yml), BENCH_HOSTS (how many hosts, in
inventory order), BENCH_DESIRED_DIR (what bench/desired.py rendered).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


def _hosts() -> list[tuple[str, dict[str, Any]]]:
    doc = yaml.safe_load(Path(os.environ["BENCH_INVENTORY"]).read_text())["all"]
    common = doc.get("vars", {})
    hosts: dict[str, dict[str, Any]] = {}
    for group in doc.get("children", {}).values():
        hosts.update(group.get("hosts") or {})
    count = int(os.environ.get("BENCH_HOSTS", len(hosts)))
    return [(name, {
        "ssh_hostname": hostvars["ansible_host"],
        "ssh_user": common.get("ansible_user", "root"),
        "ssh_key": common["ansible_ssh_private_key_file"],
        "ssh_known_hosts_file": common["gpufleet_known_hosts"],
        "ssh_strict_host_key_checking": "yes",
        "ssh_allow_agent": False,
        "ssh_look_for_keys": False,
        "desired_dir": os.environ["BENCH_DESIRED_DIR"],
    }) for name, hostvars in list(hosts.items())[:count]]


lab = _hosts()
