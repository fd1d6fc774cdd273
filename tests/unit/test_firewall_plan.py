"""Firewall role: rulesets rendered from the inventory and facts, and the changes that load them.

Rendered rulesets are also syntax-checked with the real nft / iptables-restore (check
mode only: nothing is loaded) where this machine allows it.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import shutil
import socket
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import VarError
from gpufleet.facts.catalog import file_digest_fact
from gpufleet.facts.formats import FileDigest, FileState
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.firewall_analysis.live import LIVE_RULESET, parse_live
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.provision.managed import render
from gpufleet.provision.plan import Change, Put, Run
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles import firewall
from gpufleet.roles.firewall import STATE_FILE, UNIT_LINK, UNIT_PATH, GuardedLoad

HEADER = "Managed by gpufleet (role firewall); local edits are reported as drift and replaced."
NFT_PATH = "/etc/gpufleet/firewall.nft"
IPT_PATH = "/etc/gpufleet/firewall.rules"

INVENTORY = """\
all:
  vars:
    firewall_enabled: true
    gpufleet_controllers: [172.16.0.5]
  hosts:
    gpu01:
      ansible_host: 10.0.0.11
    gpu02:
      ansible_host: 10.0.0.12
    gpu03:
      ansible_host: "fd00::13"
    login:
      ansible_host: 10.0.1.5
      ansible_port: 2222
  children:
    trainers:
      hosts:
        gpu01:
        gpu02:
        gpu03:
    v4trainers:
      hosts:
        gpu01:
        gpu02:
"""


@pytest.fixture(autouse=True)
def _fresh_resolver_cache() -> Iterator[None]:
    firewall._resolve.cache_clear()
    yield
    firewall._resolve.cache_clear()


def inventory(tmp_path: Path, extra_vars: str = "", text: str = INVENTORY) -> Inventory:
    """The inventory above; ``extra_vars`` (YAML) are added to gpu01 and login."""
    body = text
    if extra_vars:
        indented = textwrap.indent(textwrap.dedent(extra_vars), " " * 6)
        body = body.replace("      ansible_host: 10.0.0.11\n",
                            "      ansible_host: 10.0.0.11\n" + indented)
        body = body.replace("      ansible_port: 2222\n", "      ansible_port: 2222\n" + indented)
    path = tmp_path / "hosts.yml"
    path.write_text(body)
    return load_inventory(path)


def role_args(inv: Inventory, host: str = "gpu01") -> tuple[RoleVars, PlanContext]:
    h = inv.hosts[host]
    return RoleVars(h, firewall.ROLE.defaults), PlanContext(inv, h)


def rendered(inv: Inventory, facts: Facts, host: str = "gpu01") -> str:
    v, ctx = role_args(inv, host)
    return firewall.ROLE.render(facts, v, ctx)


def plan(inv: Inventory, facts: Facts, host: str = "gpu01") -> list[Change]:
    v, ctx = role_args(inv, host)
    return firewall.ROLE.plan(facts, v, ctx)


def rows(changes: list[Change]) -> list[tuple[str, str, str | None, str | None]]:
    return [(c.item, c.action, c.before, c.after) for c in changes]


CLUSTER_SETS = [("cluster4", "ipv4", ""), ("cluster6", "ipv6", "")]


def cluster_rules(port: str) -> list[str]:
    return [f"tcp dport {port} ip saddr @cluster4 accept",
            f"tcp dport {port} ip6 saddr @cluster6 accept"]


def nft(sets: list[tuple[str, str, str]], rules: list[str], drop: bool = True) -> str:
    """The expected nftables ruleset text (a set without elements is filled from the
    cluster file)."""
    lines = [
        "#!/usr/sbin/nft -f",
        f"# {HEADER}",
        '# gpufleet owns only the table "inet gpufleet"; other tables (Docker, Kubernetes) '
        "are untouched.",
        "# The chain's policy stays accept and the last rule drops: flushing this table opens "
        "the",
        "# node instead of cutting every connection, and drift reports the flush.",
        f"# The cluster's addresses are in sets filled from {firewall.CLUSTER_FILE}, which "
        "is the same on",
        "# every node of the cluster: a node joining changes that file, not this one.",
        "table inet gpufleet",
        "delete table inet gpufleet",
        "table inet gpufleet {",
    ]
    for name, family, elements in sets:
        lines += [f"\tset {name} {{", f"\t\ttype {family}_addr", "\t\tflags interval",
                  "\t\tauto-merge"]
        lines += [f"\t\telements = {{ {elements} }}"] if elements else []
        lines += ["\t}"]
    lines += [
        "\tchain input {",
        "\t\ttype filter hook input priority filter; policy accept;",
        "\t\tct state established,related accept",
        "\t\tct state invalid drop",
        '\t\tiifname "lo" accept',
        "\t\tmeta l4proto { icmp, ipv6-icmp } accept",
    ]
    lines += [f"\t\t{rule}" for rule in rules]
    lines += ["\t\tdrop"] if drop else []
    lines += ["\t}", "}", f'include "{firewall.CLUSTER_FILE}"']
    return "\n".join(lines) + "\n"


def cluster_file(inv: Inventory, host: str = "gpu01") -> str:
    v, ctx = role_args(inv, host)
    return firewall.ROLE.cluster_file(v, ctx)[0].decode()


def cluster_elements(text: str) -> dict[str, str]:
    """The elements the cluster file adds to each set."""
    return dict(re.findall(r"^add element inet gpufleet (\S+) \{ (.*) \}$", text, re.MULTILINE))


def iptables(rules: list[str], last: str = "DROP") -> str:
    lines = [
        f"# {HEADER}",
        "# Loaded with iptables-restore --noflush: gpufleet owns only the GPUFLEET-INPUT chain.",
        "*filter",
        ":GPUFLEET-INPUT - [0:0]",
        "-F GPUFLEET-INPUT",
        "-A GPUFLEET-INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        "-A GPUFLEET-INPUT -m conntrack --ctstate INVALID -j DROP",
        "-A GPUFLEET-INPUT -i lo -j ACCEPT",
        "-A GPUFLEET-INPUT -p icmp -j ACCEPT",
    ]
    lines += [f"-A GPUFLEET-INPUT {rule}" for rule in rules]
    lines += [f"-A GPUFLEET-INPUT -j {last}", "COMMIT"]
    return "\n".join(lines) + "\n"


MAIN_VARS = """\
firewall_cluster_group: trainers
firewall_extra_cidrs: [192.168.100.0/24, "2001:db8::/64"]
firewall_open_tcp_ports: [8080]
"""


# --------------------------------------------------------------------------- nftables render


def test_nft_render_sets_from_inventory_ipv6_extra_cidrs_and_controller(tmp_path: Path) -> None:
    inv = inventory(tmp_path, MAIN_VARS)
    text = rendered(inv, Facts("gpu01", values={"ssh_client": "172.16.0.5"}))
    assert text == nft(
        [*CLUSTER_SETS, ("admin4", "ipv4", "172.16.0.5")],
        [*cluster_rules("29500"), *cluster_rules("49152-65535"), *cluster_rules("22"),
         "tcp dport 22 ip saddr @admin4 accept", *cluster_rules("8080")])
    assert cluster_elements(cluster_file(inv)) == {
        "cluster4": "10.0.0.11, 10.0.0.12, 192.168.100.0/24",
        "cluster6": "2001:db8::/64, fd00::13"}


def test_the_cluster_file_merges_contiguous_addresses_into_prefixes(tmp_path: Path) -> None:
    hosts = "".join(f"    n{i:03d}: {{ansible_host: 10.8.{i // 256}.{i % 256}}}\n"
                    for i in range(1, 512))
    inv = inventory(tmp_path, text="all:\n  vars: {firewall_enabled: true}\n  hosts:\n" + hosts)
    text = cluster_file(inv, "n001")
    assert cluster_elements(text) == {"cluster4": "10.8.0.1, 10.8.0.2/31, 10.8.0.4/30, "
                                                  "10.8.0.8/29, 10.8.0.16/28, 10.8.0.32/27, "
                                                  "10.8.0.64/26, 10.8.0.128/25, 10.8.1.0/24"}
    assert "flush set inet gpufleet cluster6" in text
    assert "cluster6 {" not in text  # an empty set is flushed, never given an empty list
    assert cluster_file(inv, "n300") == text  # the same on every node


def test_a_node_joining_changes_the_cluster_file_not_the_rulesets(tmp_path: Path) -> None:
    before = inventory(tmp_path)
    ruleset, sets = rendered(before, Facts("gpu01")), cluster_file(before)
    joined = inventory(tmp_path, text=INVENTORY.replace(
        "    login:\n", "    gpu05:\n      ansible_host: 10.0.0.15\n    login:\n"))
    assert rendered(joined, Facts("gpu01")) == ruleset
    assert cluster_file(joined) != sets
    assert "10.0.0.15" in cluster_file(joined)


def test_nft_render_ipv6_controller_ssh_cidrs_and_host_port(tmp_path: Path) -> None:
    inv = inventory(tmp_path, """\
        firewall_cluster_group: v4trainers
        firewall_ssh_cidrs: 10.9.0.0/16
        firewall_rendezvous_port: 29400
        firewall_port_range: "50000:51000"
        firewall_policy: accept
        gpufleet_controllers: ["2001:db8:1::5"]
        """)
    text = rendered(inv, Facts("login", values={"ssh_client": "2001:db8:1::5"}), host="login")
    assert text == nft(
        [*CLUSTER_SETS, ("admin4", "ipv4", "10.9.0.0/16"), ("admin6", "ipv6", "2001:db8:1::5")],
        [*cluster_rules("29400"), *cluster_rules("50000-51000"), *cluster_rules("2222"),
         "tcp dport 2222 ip saddr @admin4 accept", "tcp dport 2222 ip6 saddr @admin6 accept"],
        drop=False)
    assert cluster_elements(cluster_file(inv, "login")) == {"cluster4": "10.0.0.11, 10.0.0.12"}


def test_nft_render_without_the_controller(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "firewall_cluster_group: v4trainers\n"
                              "firewall_allow_controller: false\n")
    text = rendered(inv, Facts("gpu01", values={"ssh_client": "172.16.0.5"}))
    assert text == nft(CLUSTER_SETS, [*cluster_rules("29500"), *cluster_rules("49152-65535"),
                                      *cluster_rules("22")])


def test_cluster_group_all_includes_every_host(tmp_path: Path) -> None:
    v, ctx = role_args(inventory(tmp_path))
    assert firewall.ROLE.cluster_sources(v, ctx) == [
        "10.0.0.11/32", "10.0.0.12/32", "fd00::13/128", "10.0.1.5/32"]


def test_host_names_are_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {
        "node-a.cluster.test": [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::21", 0, 0, 0)),
                                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.21", 0)),
                                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.21", 0))],
    }

    def fake_getaddrinfo(host: str, *args: Any, **kwargs: Any) -> list[Any]:
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return answers[host]

    monkeypatch.setattr(firewall.socket, "getaddrinfo", fake_getaddrinfo)
    inv = inventory(tmp_path, text="""\
all:
  hosts:
    gpu01:
      ansible_host: node-a.cluster.test
      firewall_enabled: true
""")
    v, ctx = role_args(inv)
    assert firewall.ROLE.cluster_sources(v, ctx) == ["10.0.0.21", "fd00::21"]

    inv = inventory(tmp_path, text="""\
all:
  hosts:
    gpu01:
      ansible_host: 10.0.0.11
    gpu04:
      ansible_host: node-gone.invalid
""")
    with pytest.raises(VarError) as caught:
        rendered(inv, Facts("gpu01"))
    assert str(caught.value) == ("host gpu01: cannot resolve the address of cluster host gpu04 "
                                 "(node-gone.invalid) for the firewall")


@pytest.mark.parametrize(("extra", "message"), [
    ("firewall_policy: reject\n", "host gpu01: firewall_policy must be drop or accept"),
    ("firewall_cluster_group: trainer\n",
     "host gpu01: firewall_cluster_group 'trainer' is not a group of the inventory"),
    ("firewall_extra_cidrs: [10.0.0.0/33]\n",
     "host gpu01: firewall_extra_cidrs entry '10.0.0.0/33' is not an address or CIDR"),
    ("firewall_ssh_cidrs: [bastion]\n",
     "host gpu01: firewall_ssh_cidrs entry 'bastion' is not an address or CIDR"),
    ("firewall_port_range: 65535-1024\n",
     "host gpu01: firewall_port_range '65535-1024' is not a valid port range"),
    ("firewall_rendezvous_port: rdzv\n",
     "host gpu01: firewall_rendezvous_port value 'rdzv' is not a TCP port (1-65535)"),
])
def test_render_variable_errors(tmp_path: Path, extra: str, message: str) -> None:
    inv = inventory(tmp_path, extra)
    with pytest.raises(VarError) as caught:
        rendered(inv, Facts("gpu01"))
    assert str(caught.value) == message


@pytest.mark.parametrize("port", ["http", "70000", "0"])
def test_open_tcp_ports_must_be_valid_ports(tmp_path: Path, port: str) -> None:
    inv = inventory(tmp_path, f"firewall_open_tcp_ports: [{port}]\n")
    with pytest.raises(VarError, match="firewall_open_tcp_ports"):
        rendered(inv, Facts("gpu01"))


def test_backend_must_be_known(tmp_path: Path) -> None:
    v, _ = role_args(inventory(tmp_path, "firewall_backend: ufw\n"))
    with pytest.raises(VarError, match=r"^host gpu01: firewall_backend must be nftables or "
                                       r"iptables, got 'ufw'$"):
        firewall.ROLE.backend(v)


# --------------------------------------------------------------------------- iptables render


def test_iptables_render(tmp_path: Path) -> None:
    inv = inventory(tmp_path, """\
        firewall_backend: iptables
        firewall_cluster_group: v4trainers
        firewall_extra_cidrs: [192.168.100.0/24]
        """)
    text = rendered(inv, Facts("gpu01", values={"ssh_client": "172.16.0.5"}))
    assert text == iptables([
        "-p tcp -s 10.0.0.11/32 --dport 29500 -j ACCEPT",
        "-p tcp -s 10.0.0.12/32 --dport 29500 -j ACCEPT",
        "-p tcp -s 192.168.100.0/24 --dport 29500 -j ACCEPT",
        "-p tcp -s 10.0.0.11/32 --dport 49152:65535 -j ACCEPT",
        "-p tcp -s 10.0.0.12/32 --dport 49152:65535 -j ACCEPT",
        "-p tcp -s 192.168.100.0/24 --dport 49152:65535 -j ACCEPT",
        "-p tcp -s 10.0.0.11/32 --dport 22 -j ACCEPT",
        "-p tcp -s 10.0.0.12/32 --dport 22 -j ACCEPT",
        "-p tcp -s 172.16.0.5/32 --dport 22 -j ACCEPT",
        "-p tcp -s 192.168.100.0/24 --dport 22 -j ACCEPT",
    ])


def test_iptables_accept_policy_returns(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "firewall_backend: iptables\nfirewall_policy: accept\n"
                    "firewall_cluster_group: v4trainers\n")
    assert rendered(inv, Facts("gpu01")).endswith(
        "--dport 22 -j ACCEPT\n-A GPUFLEET-INPUT -j RETURN\nCOMMIT\n")


def test_iptables_render_never_puts_ipv6_sources_in_ipv4_rules(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "firewall_backend: iptables\nfirewall_cluster_group: trainers\n")
    try:
        text = rendered(inv, Facts("gpu01"))
    except VarError:
        return  # refusing the configuration clearly is also a fix
    sources = re.findall(r" -s (\S+) ", text)
    assert sources
    assert all(ipaddress.ip_network(s).version == 4 for s in sources), sources


# --------------------------------------------------------------------------- overlapping sets


def _set_elements(text: str) -> list[tuple[str, list[str]]]:
    """(set block, its elements) for every set in an nftables ruleset."""
    blocks = re.findall(r"\tset \S+ \{\n(.*?)\n\t\}", text, re.DOTALL)
    found = []
    for block in blocks:
        match = re.search(r"elements = \{ (.*) \}", block)
        if match is not None:  # the cluster's sets are filled from the cluster file
            found.append((block, [e.strip() for e in match.group(1).split(",")]))
    return found


def test_nft_sets_never_hold_overlapping_intervals(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "firewall_cluster_group: v4trainers\n"
                    "firewall_extra_cidrs: [10.0.0.0/24]\n"
                    "firewall_ssh_cidrs: [10.9.0.0/16, 10.9.4.0/24]\n")
    text = rendered(inv, Facts("gpu01"))
    groups = [[e.strip() for e in elements.split(",")]
              for elements in cluster_elements(cluster_file(inv)).values()]
    groups += [elements for _, elements in _set_elements(text)]
    assert ["10.0.0.0/24"] in groups and ["10.9.0.0/16", "172.16.0.5"] in groups
    for elements in groups:
        nets = [ipaddress.ip_network(e) for e in elements]
        for i, a in enumerate(nets):
            for b in nets[i + 1:]:
                assert not a.overlaps(b), f"{a} overlaps {b}"


# --------------------------------------------------------------------------- real syntax checks


def _tool_works(argv: list[str], stdin: str) -> bool:
    if shutil.which(argv[0]) is None:
        return False
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=20,
                          check=False)
    return proc.returncode == 0


NFT_PROBE = "table inet gpufleet_probe {\n\tchain c {\n\t}\n}\n"
IPT_PROBE = "*filter\n:GPUFLEET-PROBE - [0:0]\nCOMMIT\n"


def test_nft_ruleset_passes_nft_check(tmp_path: Path) -> None:
    if not _tool_works(["nft", "-c", "-f", "-"], NFT_PROBE):
        pytest.skip("nft -c is not usable here")
    inv = inventory(tmp_path, MAIN_VARS)
    sets, path = tmp_path / "cluster.nft", tmp_path / "ruleset.nft"
    sets.write_text(cluster_file(inv))
    path.write_text(rendered(inv, Facts("gpu01", values={"ssh_client": "172.16.0.5"}))
                    .replace(firewall.CLUSTER_FILE, str(sets)))
    proc = subprocess.run(["nft", "-c", "-f", str(path)], capture_output=True, text=True,
                          timeout=20, check=False)
    assert proc.returncode == 0, proc.stderr


def test_iptables_ruleset_passes_iptables_restore_test(tmp_path: Path) -> None:
    if not _tool_works(["iptables-restore", "--test", "--noflush"], IPT_PROBE):
        pytest.skip("iptables-restore --test is not usable here")
    inv = inventory(tmp_path, "firewall_backend: iptables\nfirewall_cluster_group: v4trainers\n"
                    "firewall_open_tcp_ports: [8080]\n")
    text = rendered(inv, Facts("gpu01", values={"ssh_client": "172.16.0.5"}))
    proc = subprocess.run(["iptables-restore", "--test", "--noflush"], input=text,
                          capture_output=True, text=True, timeout=20, check=False)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- plan


NFT_UNIT = render("gpufleet-firewall.service.j2", header=HEADER,
                  exec_start=f"/usr/sbin/nft -f {NFT_PATH}")


def test_unit_file_exec_start() -> None:
    assert "\nExecStart=/usr/sbin/nft -f /etc/gpufleet/firewall.nft\n" in NFT_UNIT
    backend = firewall._backend("iptables", IPT_PATH)
    assert backend.exec_start == (
        "/bin/sh -c 'iptables-restore --noflush < /etc/gpufleet/firewall.rules && "
        "(iptables -C INPUT -j GPUFLEET-INPUT 2>/dev/null || "
        "iptables -I INPUT 1 -j GPUFLEET-INPUT)'")


def _unit_section(text: str) -> dict[str, list[str]]:
    """``[Unit]`` keys as systemd reads them: a key given twice adds to its list."""
    found: dict[str, list[str]] = {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == "[Unit]" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            found.setdefault(key, []).extend(value.split())
    return found


@pytest.mark.parametrize("backend", ["nftables", "iptables"])
def test_the_unit_loads_before_any_interface_comes_up(tmp_path: Path, backend: str) -> None:
    """Ordered like Debian's own nftables.service (read from this machine), so no interface
    is up before gpufleet's rules are; systemd-analyze verify finds nothing to say."""
    path = NFT_PATH if backend == "nftables" else IPT_PATH
    unit = render("gpufleet-firewall.service.j2", header=HEADER,
                  exec_start=firewall._backend(backend, path).exec_start)
    ours = _unit_section(unit)
    debian = _unit_section(Path("/lib/systemd/system/nftables.service").read_text())
    for key in ("Wants", "Before", "Conflicts", "DefaultDependencies"):
        assert set(debian[key]) <= set(ours[key]), key
    assert "network-pre.target" not in ours.get("After", [])
    assert ours["After"] == ["nftables.service"]  # its flush must not come after our table
    (tmp_path / "gpufleet-firewall.service").write_text(unit)
    done = subprocess.run(["systemd-analyze", "verify", "--man=no",
                           str(tmp_path / "gpufleet-firewall.service")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_request(tmp_path: Path) -> None:
    v, _ = role_args(inventory(tmp_path))
    assert firewall.ROLE.active(v)
    assert firewall.ROLE.request(v) == FactRequest(
        files=frozenset({NFT_PATH, STATE_FILE, UNIT_PATH}), links=frozenset({UNIT_LINK}),
        custom=frozenset({LIVE_RULESET, file_digest_fact(firewall.CLUSTER_FILE)}))
    v, _ = role_args(inventory(tmp_path, "firewall_backend: iptables\n"
                               "firewall_ruleset_path: /srv/fw.rules\n"))
    assert firewall.ROLE.request(v).files == frozenset({"/srv/fw.rules", STATE_FILE, UNIT_PATH})


def fw_facts(ruleset: FileState, *, digest: str | None = "d1", recorded: str | None = "d1",
             unit: bool = True, link: str | None = "../gpufleet-firewall.service",
             firewall_fact: bool = True, backend: str = "nftables",
             state_text: str | None = None, sets: FileDigest | None = None) -> Facts:
    values: dict[str, Any] = {
        "ssh_client": "172.16.0.5",
        f"file:{ruleset.path}": ruleset,
        f"file_digest:{firewall.CLUSTER_FILE}": sets or FileDigest(firewall.CLUSTER_FILE, False),
        f"file:{UNIT_PATH}": (FileState(UNIT_PATH, True, NFT_UNIT.encode(), "644", "root:root")
                              if unit else FileState(UNIT_PATH, False)),
        f"link:{UNIT_LINK}": link,
    }
    if state_text is None and recorded is not None:
        state_text = json.dumps({"backend": backend, "live_sha256": recorded}) + "\n"
    values[f"file:{STATE_FILE}"] = (FileState(STATE_FILE, True, state_text.encode(), "644",
                                              "root:root")
                                    if state_text is not None else FileState(STATE_FILE, False))
    absent = {}
    if firewall_fact:
        values["firewall"] = {
            "nft_available": True, "nft_tables": ["inet:gpufleet"],
            "nft_gpufleet_digest": digest if backend == "nftables" else None,
            "iptables_available": True,
            "iptables_gpufleet_digest": digest if backend == "iptables" else None,
            "ufw": "absent", "firewalld": "absent"}
    else:
        absent["firewall"] = "exit status 1"
    return Facts("gpu01", values=values, absent=absent)


def current_ruleset(inv: Inventory) -> FileState:
    text = rendered(inv, Facts("gpu01", values={"ssh_client": "172.16.0.5"}))
    return FileState(NFT_PATH, True, text.encode(), "600", "root:root")


def current_sets(inv: Inventory) -> FileDigest:
    data = cluster_file(inv).encode()
    return FileDigest(firewall.CLUSTER_FILE, True, hashlib.sha256(data).hexdigest(), len(data),
                      "600", "root:root")


def test_plan_converged(tmp_path: Path) -> None:
    inv = inventory(tmp_path, MAIN_VARS)
    assert plan(inv, fw_facts(current_ruleset(inv), sets=current_sets(inv))) == []


def test_a_changed_cluster_file_is_loaded_alone(tmp_path: Path) -> None:
    """A node joined: only the cluster file changes (by digest: its bytes are not read)."""
    inv = inventory(tmp_path, MAIN_VARS)
    old = FileDigest(firewall.CLUSTER_FILE, True, "0" * 64, 120, "600", "root:root")
    changes = plan(inv, fw_facts(current_ruleset(inv), sets=old))
    data = cluster_file(inv).encode()
    assert rows(changes) == [(f"firewall/file {firewall.CLUSTER_FILE}", "update",
                              "120 bytes (differs)", f"{len(data)} bytes")]
    [load] = changes[0].steps
    assert isinstance(load, firewall.SetLoad) and load.content == data
    assert changes[0].diff is None


def test_plan_fresh_host(tmp_path: Path) -> None:
    inv = inventory(tmp_path, MAIN_VARS)
    facts = fw_facts(FileState(NFT_PATH, False), unit=False, link=None, digest=None,
                     recorded=None)
    text = rendered(inv, facts)
    changes = plan(inv, facts)
    sets = len(cluster_file(inv).encode())
    assert rows(changes) == [
        (f"firewall/file {firewall.CLUSTER_FILE}", "create", "absent", f"{sets} bytes"),
        (f"firewall/file {NFT_PATH}", "create", "absent", f"{len(text.encode())} bytes"),
        (f"firewall/file {UNIT_PATH}", "create", "absent", f"{len(NFT_UNIT.encode())} bytes"),
        (f"firewall/link {UNIT_LINK}", "link", "absent", "../gpufleet-firewall.service"),
    ]
    assert isinstance(changes[0].steps[0], firewall.SetLoad)
    changes = changes[1:]
    [load] = changes[0].steps
    assert isinstance(load, GuardedLoad)
    assert (load.backend.name, load.backend.path, load.content, load.guard_s) == \
        ("nftables", NFT_PATH, text.encode(), 30)
    assert load.describe() == "load nftables ruleset (guarded, 30s rollback)"
    [unit] = changes[1].steps
    assert isinstance(unit, Put)
    assert unit.content == NFT_UNIT.encode()
    assert isinstance(changes[2].steps[0], Run)


def test_plan_changed_ruleset_file_is_loaded_not_just_written(tmp_path: Path) -> None:
    inv = inventory(tmp_path, MAIN_VARS + "firewall_guard_seconds: 45\n")
    old = FileState(NFT_PATH, True, b"table inet gpufleet {}\n", "600", "root:root")
    changes = plan(inv, fw_facts(old, sets=current_sets(inv)))
    assert [(c.item, c.action, c.before) for c in changes] == [
        (f"firewall/file {NFT_PATH}", "update", "23 bytes (differs)")]
    [load] = changes[0].steps
    assert isinstance(load, GuardedLoad)
    assert load.guard_s == 45
    assert changes[0].diff is not None
    assert changes[0].diff.startswith(f"--- {NFT_PATH} (on host)\n+++ {NFT_PATH} (desired)\n")


@pytest.mark.parametrize(("kwargs", "before"), [
    ({"digest": None}, "not loaded (gpufleet's rules are missing)"),
    ({"digest": "d2"}, "changed since gpufleet loaded it"),
    ({"recorded": None}, "changed since gpufleet loaded it"),
    ({"state_text": "{not json"}, "changed since gpufleet loaded it"),
    ({"firewall_fact": False}, "unknown (exit status 1)"),
])
def test_plan_live_ruleset_missing_or_changed_reloads(tmp_path: Path, kwargs: dict[str, Any],
                                                     before: str) -> None:
    inv = inventory(tmp_path, MAIN_VARS)
    changes = plan(inv, fw_facts(current_ruleset(inv), sets=current_sets(inv), **kwargs))
    assert rows(changes) == [("firewall/live ruleset (nftables)", "reload", before,
                              "as rendered")]
    [load] = changes[0].steps
    assert isinstance(load, GuardedLoad)
    assert load.content == current_ruleset(inv).content


def test_plan_iptables_backend_uses_its_own_digest(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "firewall_backend: iptables\nfirewall_cluster_group: v4trainers\n")
    text = rendered(inv, Facts("gpu01", values={"ssh_client": "172.16.0.5"}))
    ruleset = FileState(IPT_PATH, True, text.encode(), "600", "root:root")
    unit = render("gpufleet-firewall.service.j2", header=HEADER,
                  exec_start=firewall._backend("iptables", IPT_PATH).exec_start)
    facts = fw_facts(ruleset, backend="iptables")
    facts.values[f"file:{UNIT_PATH}"] = FileState(UNIT_PATH, True, unit.encode(), "644",
                                                  "root:root")
    assert plan(inv, facts) == []
    facts.values["firewall"]["iptables_gpufleet_digest"] = None
    facts.values["firewall"]["nft_gpufleet_digest"] = "d1"
    assert rows(plan(inv, facts)) == [
        ("firewall/live ruleset (iptables)", "reload",
         "not loaded (gpufleet's rules are missing)", "as rendered"),
        ("firewall/nftables rules (previous backend)", "remove", "present", "absent")]


def test_plan_unit_link_elsewhere(tmp_path: Path) -> None:
    inv = inventory(tmp_path, MAIN_VARS)
    changes = plan(inv, fw_facts(current_ruleset(inv), link="/dev/null",
                                 sets=current_sets(inv)))
    assert rows(changes) == [(f"firewall/link {UNIT_LINK}", "link", "/dev/null",
                              "../gpufleet-firewall.service")]


@pytest.mark.parametrize("ssh_client", ["172.16.0.5", "172.16.0.99", None])
def test_the_ruleset_is_the_same_from_any_controller(tmp_path: Path,
                                                     ssh_client: str | None) -> None:
    inv = inventory(tmp_path, MAIN_VARS + "gpufleet_controllers: [172.16.0.5, 172.16.0.6]\n")
    text = rendered(inv, Facts("gpu01", values={"ssh_client": ssh_client}))
    assert text == rendered(inv, Facts("gpu01"))
    assert "elements = { 172.16.0.5, 172.16.0.6 }" in text


def test_controllers_must_be_listed_when_the_controller_is_allowed(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "gpufleet_controllers: []\n")
    with pytest.raises(VarError, match=r"^host gpu01: firewall_allow_controller is true but "
                       r"gpufleet_controllers is not set: list the addresses gpufleet runs from "
                       r"\(this run connects from 172\.16\.0\.9\), or set "
                       r"firewall_allow_controller: false$"):
        rendered(inv, Facts("gpu01", values={"ssh_client": "172.16.0.9"}))


def test_a_controller_that_is_no_address_is_a_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unresolvable(host: str, *args: Any, **kwargs: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(firewall.socket, "getaddrinfo", unresolvable)
    inv = inventory(tmp_path, "gpufleet_controllers: [no-such-host.invalid]\n")
    with pytest.raises(VarError, match=r"gpufleet_controllers entry 'no-such-host.invalid' is "
                       "not an address"):
        rendered(inv, Facts("gpu01"))


LIVE = Path(__file__).resolve().parents[1] / "fixtures" / "firewall" / "live"


def test_a_foreign_rule_that_drops_the_cluster_is_drift(tmp_path: Path) -> None:
    """The live ruleset captured from a node (nft with a foreign higher-priority table, and
    an iptables-nft rule) beside gpufleet's converged table: each shadowing rule is an
    item that names it; gpufleet leaves the rule alone (an operator must)."""
    inv = inventory(tmp_path, "firewall_cluster_group: v4trainers\n")
    inv.hosts["gpu02"].vars["ansible_host"] = "10.1.0.12"
    inv.hosts["gpu01"].vars["ansible_host"] = "10.1.0.11"
    v, ctx = role_args(inv)
    live = parse_live((LIVE / "foreign-and-iptables-nft.txt").read_text())
    changes = firewall.ROLE._shadowing(Facts("gpu01", values={"live_ruleset": live}), v, ctx)
    assert [(c.resource, c.kind) for c in changes] == [
        ("foreign rule in table ip filter chain INPUT handle 2", "firewall"),
        ("foreign rule in table inet foreign chain input handle 2", "firewall")]
    assert changes[1].before == ("tcp dports 52000-52099 from 10.1.0.12 are dropped by table "
                                 "inet foreign chain input (priority -10) handle 2: tcp dport "
                                 "52000-52099 ip saddr 10.1.0.12 drop")
    assert changes[0].before.startswith("tcp dport 29500 from 10.1.0.11 is rejected by ")
    empty = parse_live((LIVE / "empty.txt").read_text())
    assert firewall.ROLE._shadowing(Facts("gpu01", values={"live_ruleset": empty}), v,
                                    ctx) == []
