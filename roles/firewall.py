"""Firewall: SSH, the rendezvous port and NCCL's port range open to the cluster only.

nftables by default (gpufleet owns only ``table inet gpufleet``), iptables as the
alternative (only the ``GPUFLEET-INPUT`` chain and its jump from INPUT). Every
ruleset is syntax-checked before it is loaded, loaded atomically, and guarded: a
rollback armed on the node restores the previous rules after N seconds unless the
controller confirms over a NEW SSH connection that it can still get in.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import shlex
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from gpufleet.connect.connection import BACKUP_SUFFIX
from gpufleet.errors import GpufleetError, VarError
from gpufleet.facts.catalog import IPTABLES_DIGEST, NFT_DIGEST, file_digest_fact
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.firewall_analysis.live import LIVE_RULESET, analyse_live
from gpufleet.ports import PORT_RANGE, RENDEZVOUS_PORT, parse_range
from gpufleet.provision.managed import HEADER, digest_change, file_change, link_change, render
from gpufleet.provision.plan import ApplyContext, Change, Fail, Run
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var

STATE_DIR = "/etc/gpufleet"
STATE_FILE = f"{STATE_DIR}/firewall.state"
CLUSTER_FILE = f"{STATE_DIR}/firewall-cluster.nft"
CLUSTER_SETS = {"ipv4": "cluster4", "ipv6": "cluster6"}
ADMIN_SETS = {"ipv4": "admin4", "ipv6": "admin6"}
NAMED_SOURCES = 64
"""Up to this many cluster addresses, the firewall check names each; above, it names the
cluster's prefixes (its messages stay readable, its cost flat)."""
UNIT_PATH = "/etc/systemd/system/gpufleet-firewall.service"
UNIT_LINK = "/etc/systemd/system/multi-user.target.wants/gpufleet-firewall.service"
LOCK = f"{STATE_DIR}/firewall.guard.lock"
CONFIRMED = f"{STATE_DIR}/firewall.confirmed"
FIRED = f"{STATE_DIR}/firewall.guard-fired"
CONTROLLERS_VAR = "gpufleet_controllers"
_GROUP = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                        r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?\Z")


@dataclass(frozen=True)
class Backend:
    """The commands one firewall backend needs; ``{staged}`` stands for the staged file."""

    name: str
    path: str
    check: str
    load: str
    snapshot: str
    restore: str
    digest: str
    exec_start: str


def _backend(name: str, path: str) -> Backend:
    p = shlex.quote(path)
    rollback = shlex.quote(f"{STATE_DIR}/firewall.rollback")
    if name == "nftables":
        return Backend(
            name, path,
            check="nft -c -f {staged}",
            load="nft -f {staged}",
            snapshot=(f"{{ echo 'table inet gpufleet'; echo 'delete table inet gpufleet'; "
                      f"nft list table inet gpufleet 2>/dev/null || true; }} > {rollback}"),
            restore=f"nft -f {rollback}",
            digest=NFT_DIGEST,
            exec_start=f"/usr/sbin/nft -f {p}",
        )
    jump = ("iptables -C INPUT -j GPUFLEET-INPUT 2>/dev/null || "
            "iptables -I INPUT 1 -j GPUFLEET-INPUT")
    return Backend(
        name, path,
        check="iptables-restore --test --noflush < {staged}",
        load="iptables-restore --noflush < {staged} && { " + jump + "; }",
        snapshot=(f"if iptables -n -L GPUFLEET-INPUT >/dev/null 2>&1; then "
                  f"{{ echo '*filter'; echo ':GPUFLEET-INPUT - [0:0]'; echo '-F GPUFLEET-INPUT'; "
                  f"iptables-save -t filter | grep '^-A GPUFLEET-INPUT'; echo COMMIT; }} "
                  f"> {rollback}; else echo none > {rollback}; fi"),
        restore=(f"if [ \"$(cat {rollback})\" = none ]; then "
                 "iptables -D INPUT -j GPUFLEET-INPUT 2>/dev/null; "
                 "iptables -F GPUFLEET-INPUT 2>/dev/null; iptables -X GPUFLEET-INPUT 2>/dev/null; "
                 f"true; else iptables-restore --noflush < {rollback}; fi"),
        digest=IPTABLES_DIGEST,
        exec_start=f"/bin/sh -c 'iptables-restore --noflush < {path} && ({jump})'",
    )


@cache
def _resolve(address: str) -> tuple[str, ...]:
    """The addresses rules name for ``address`` (an IP, a CIDR or a name). An IPv6 zone
    (``fe80::1%eth0``) only says which interface reaches the host: rules use the address."""
    plain = address.split("%", 1)[0] if ":" in address else address
    try:
        return (str(ipaddress.ip_network(plain, strict=False)),)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(plain, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return ()
    return tuple(sorted({str(info[4][0]).split("%", 1)[0] for info in infos}))


def _is_address_or_name(text: str) -> bool:
    """Whether ``text`` is an IP address, a CIDR or a DNS name (resolved when the plan is
    made): checked before any host is contacted."""
    try:
        ipaddress.ip_network(text.split("%", 1)[0] if ":" in text else text, strict=False)
    except ValueError:
        return bool(_HOST_NAME.match(text)) and len(text) <= 253
    return True


def _prefixed(source: str) -> str:
    """An address as iptables-save prints it (``10.0.0.11/32``)."""
    return source if "/" in source else f"{source}/{32 if ':' not in source else 128}"


@cache
def collapse(networks: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """IPv4 and IPv6 sources with contiguous addresses merged into prefixes (declared
    CIDRs kept as they are, or merged into a larger one), single addresses without their
    prefix; cached, as every host of a cluster asks for the same."""
    parsed = [ipaddress.ip_network(n, strict=False) for n in networks]
    v4 = ipaddress.collapse_addresses(n for n in parsed if isinstance(n, ipaddress.IPv4Network))
    v6 = ipaddress.collapse_addresses(n for n in parsed if isinstance(n, ipaddress.IPv6Network))

    def texts(merged: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network]
              ) -> tuple[str, ...]:
        return tuple(str(n.network_address) if n.num_addresses == 1 else str(n) for n in merged)

    return {"ipv4": texts(v4), "ipv6": texts(v6)}


@dataclass(eq=False)
class SetLoad:
    """Write the cluster's address sets and, when gpufleet's table is loaded, load them
    (checked first): a node joining the cluster changes only this file on the others."""

    content: bytes

    def describe(self) -> str:
        return f"load the cluster's address sets ({CLUSTER_FILE})"

    def apply(self, ctx: ApplyContext) -> None:
        staged = shlex.quote(f"{CLUSTER_FILE}.new")
        final = shlex.quote(CLUSTER_FILE)
        ctx.conn.run(f"mkdir -p {STATE_DIR}", timeout=30).check(f"creating {STATE_DIR}")
        ctx.conn.put(f"{CLUSTER_FILE}.new", self.content, mode=0o600, backup=False)
        loaded = ctx.conn.run(f"nft list set inet gpufleet {CLUSTER_SETS['ipv4']} "
                              ">/dev/null 2>&1", timeout=30).ok
        if loaded:
            ctx.conn.run(f"nft -c -f {staged}", timeout=60).check(
                "syntax check of the cluster's address sets")
        ctx.conn.run(f"mv -f {staged} {final}", timeout=30).check(
            "committing the cluster's address sets")
        if not loaded:
            return  # the ruleset's load, next, includes the file
        ctx.conn.run(f"nft -f {final}", timeout=60).check("loading the cluster's address sets")
        digest = ctx.conn.run(NFT_DIGEST, timeout=60).check("digest of the live ruleset")
        state = {"backend": "nftables", "live_sha256": digest.stdout.strip()}
        ctx.conn.put(STATE_FILE, (json.dumps(state, sort_keys=True) + "\n").encode())


@dataclass(eq=False)
class GuardedLoad:
    """Check, arm the rollback, load, confirm over a new connection, then commit."""

    backend: Backend
    content: bytes
    guard_s: int

    def describe(self) -> str:
        return f"load {self.backend.name} ruleset (guarded, {self.guard_s}s rollback)"

    def apply(self, ctx: ApplyContext) -> None:
        b = self.backend
        staged = f"{b.path}.new"
        q = shlex.quote(staged)
        ctx.conn.put(staged, self.content, mode=0o600, backup=False)
        ctx.conn.run(b.check.replace("{staged}", q), timeout=60).check(
            f"syntax check of the {b.name} ruleset")
        ctx.conn.run(f"mkdir -p {STATE_DIR} && {b.snapshot}", timeout=60).check(
            "saving the current ruleset for rollback")
        rollback = f"[ -e {CONFIRMED} ] || {{ {b.restore}; date +'%s rolled back' > {FIRED}; }}"
        guard = f"sleep {self.guard_s}; flock {LOCK} sh -c {shlex.quote(rollback)}"
        armed = ctx.conn.run(
            f"rm -f {CONFIRMED} {FIRED}; setsid sh -c {shlex.quote(guard)} </dev/null "
            f">/dev/null 2>&1 & echo $!", timeout=30).check("arming the rollback guard")
        armed_at = time.monotonic()
        ctx.conn.run(b.load.replace("{staged}", q), timeout=60).check(
            f"loading the {b.name} ruleset")
        self._confirm(ctx, armed_at)
        final = shlex.quote(b.path)
        ctx.conn.run(f"kill {shlex.quote(armed.stdout.strip())} 2>/dev/null; "
                     f"if [ -f {final} ]; then cp -p {final} {final}{BACKUP_SUFFIX}; fi; "
                     f"mv -f {q} {final}", timeout=30).check("committing ruleset")
        digest = ctx.conn.run(b.digest, timeout=60).check("digest of the live ruleset")
        state = {"backend": b.name, "live_sha256": digest.stdout.strip()}
        ctx.conn.put(STATE_FILE, (json.dumps(state, sort_keys=True) + "\n").encode())

    def _confirm(self, ctx: ApplyContext, armed_at: float) -> None:
        """Over a NEW connection, mark the ruleset confirmed unless the guard already fired.

        Guard and confirmation take the same lock, so exactly one of them wins.
        """
        confirm = f"[ -e {FIRED} ] && exit 3; touch {CONFIRMED}"
        try:
            fresh = ctx.reconnect()
            try:
                result = fresh.run(f"flock {LOCK} sh -c {shlex.quote(confirm)}", timeout=15)
            finally:
                fresh.close()
        except GpufleetError as exc:
            remaining = self.guard_s - (time.monotonic() - armed_at)
            time.sleep(max(0.0, remaining) + 2)
            raise GpufleetError(
                f"after loading the new ruleset a new SSH connection failed ({exc}); the "
                f"guard restored the previous ruleset after {self.guard_s}s") from exc
        if result.rc == 3:
            raise GpufleetError(
                "a new SSH connection got in only after the guard had restored the previous "
                f"ruleset ({self.guard_s}s): the new ruleset cut the controller off")
        result.check("confirming the ruleset")


class FirewallRole(RoleBase):
    name = "firewall"
    order = 90
    variables: ClassVar[Mapping[str, Var]] = {
        "firewall_enabled": Var(False, "boolean", "manage the firewall on this host"),
        "firewall_backend": Var("nftables", "string", "nftables or iptables"),
        "firewall_policy": Var("drop", "string", "drop or accept"),
        "firewall_rendezvous_port": Var(RENDEZVOUS_PORT, "integer", "TCP port open to the cluster"),
        "firewall_port_range": Var(PORT_RANGE, "string", "TCP range open to the cluster"),
        "firewall_open_tcp_ports": Var([], "list", "more TCP ports open to the cluster"),
        "firewall_cluster_group": Var("all", "string", "the group that forms the cluster"),
        "firewall_extra_cidrs": Var([], "list", "addresses treated as cluster members"),
        "firewall_ssh_cidrs": Var([], "list", "addresses allowed to SSH"),
        "firewall_allow_controller": Var(True, "boolean",
                                         "allow SSH from gpufleet_controllers"),
        CONTROLLERS_VAR: Var([], "list", "the addresses gpufleet runs from"),
        "firewall_guard_seconds": Var(30, "integer", "seconds before a rollback"),
        "firewall_ruleset_path": Var(None, "string", "where the ruleset file lives"),
    }

    def active(self, v: RoleVars) -> bool:
        return v.boolean("firewall_enabled")

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if not self.active(v):
            return
        self.backend(v)
        self._port(v, v.get("firewall_rendezvous_port"), "firewall_rendezvous_port")
        for port in v.items("firewall_open_tcp_ports"):
            self._port(v, port, "firewall_open_tcp_ports")
        parse_range(v.string("firewall_port_range"), v.host.name, "firewall_port_range")
        if v.integer("firewall_guard_seconds") < 5:
            raise v.fail("firewall_guard_seconds", "at least 5 (seconds before the guard "
                         "restores the previous rules)", v.get("firewall_guard_seconds"))
        if v.string("firewall_policy") not in ("drop", "accept"):
            raise v.fail("firewall_policy", "drop or accept", v.get("firewall_policy"))
        if not _GROUP.match(v.string("firewall_cluster_group")):
            raise v.fail("firewall_cluster_group", "a group name", v.get("firewall_cluster_group"))
        self.extra_cidrs(v)
        for cidr in v.items("firewall_ssh_cidrs"):
            self._cidr(v, cidr, "firewall_ssh_cidrs")
        for entry in v.items(CONTROLLERS_VAR):
            if not _is_address_or_name(str(entry)):
                raise VarError(f"host {v.host.name}: {CONTROLLERS_VAR} entry {entry!r} is not "
                               "an address, a CIDR or a host name")

    def admits_members(self, v: RoleVars) -> str | None:
        return v.string("firewall_cluster_group") if self.active(v) else None

    def in_use(self, facts: Facts, v: RoleVars) -> bool:
        state = facts.values.get(f"file:{STATE_FILE}")
        return bool(state is not None and state.exists)

    def backend(self, v: RoleVars) -> Backend:
        name = v.string("firewall_backend")
        if name not in ("nftables", "iptables"):
            raise VarError(f"host {v.host.name}: firewall_backend must be nftables or "
                           f"iptables, got {name!r}")
        default = f"{STATE_DIR}/firewall.{'nft' if name == 'nftables' else 'rules'}"
        path = (v.path("firewall_ruleset_path", "it is run by the boot unit")
                if v.opt_string("firewall_ruleset_path") else default)
        return _backend(name, path)

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        files = {"firewall_ruleset_path": self.backend(v).path, "boot unit": UNIT_PATH}
        if v.string("firewall_backend") == "nftables":
            files["cluster address sets"] = CLUSTER_FILE
        return files

    def request(self, v: RoleVars) -> FactRequest:
        custom = {LIVE_RULESET}
        if v.string("firewall_backend") == "nftables":
            custom.add(file_digest_fact(CLUSTER_FILE))
        return FactRequest(files=frozenset({self.backend(v).path, STATE_FILE, UNIT_PATH}),
                           links=frozenset({UNIT_LINK}), custom=frozenset(custom))

    def cluster_members(self, v: RoleVars, ctx: PlanContext) -> tuple[str, ...]:
        """The addresses of the cluster group's hosts, from the inventory (resolved once
        per run for the whole group)."""
        group = v.string("firewall_cluster_group")
        if group not in ctx.inventory.groups:
            raise VarError(f"host {v.host.name}: firewall_cluster_group {group!r} is not a "
                           "group of the inventory")

        def members() -> tuple[str, ...]:
            sources: list[str] = []
            for name in sorted(ctx.inventory.groups[group]):
                host = ctx.inventory.hosts[name]
                resolved = _resolve(host.address)
                if not resolved:
                    raise VarError(f"host {v.host.name}: cannot resolve the address of "
                                   f"cluster host {name} ({host.address}) for the firewall")
                sources += resolved
            return tuple(sources)

        return ctx.inventory.memo(("firewall_cluster_sources", group), members)

    def extra_cidrs(self, v: RoleVars) -> tuple[str, ...]:
        return tuple(self._cidr(v, c, "firewall_extra_cidrs")
                     for c in v.items("firewall_extra_cidrs"))

    def cluster_sources(self, v: RoleVars, ctx: PlanContext) -> list[str]:
        """The cluster's own addresses (from the inventory) plus the extra CIDRs."""
        return [*self.cluster_members(v, ctx), *self.extra_cidrs(v)]

    def cluster_networks(self, v: RoleVars, ctx: PlanContext) -> dict[str, tuple[str, ...]]:
        """The cluster's sources by family, contiguous addresses merged into prefixes:
        computed once per run for every host of the group."""
        members, extra = self.cluster_members(v, ctx), self.extra_cidrs(v)
        return ctx.inventory.memo(("firewall_cluster_networks", members, extra),
                                  lambda: collapse((*members, *extra)))

    def cluster_file(self, v: RoleVars, ctx: PlanContext) -> tuple[bytes, str]:
        """The cluster's address sets file and its SHA-256: the same for every host of
        the group, rendered and hashed once per run."""
        networks = self.cluster_networks(v, ctx)

        def make() -> tuple[bytes, str]:
            content = render("nftables-cluster.nft.j2", header=HEADER.format(role=self.name),
                             sets=[(CLUSTER_SETS[f], networks[f]) for f in CLUSTER_SETS])
            data = content.encode()
            return data, hashlib.sha256(data).hexdigest()

        return ctx.inventory.memo(("firewall_cluster_file", tuple(networks.items())), make)

    def controllers(self, facts: Facts, v: RoleVars) -> list[str]:
        """The addresses gpufleet runs from (``gpufleet_controllers``), from the inventory
        only: the desired ruleset is the same whichever controller computes it."""
        listed = v.items(CONTROLLERS_VAR)
        if not listed:
            seen = facts.get("ssh_client")
            hint = f" (this run connects from {seen})" if seen else ""
            raise VarError(f"host {v.host.name}: firewall_allow_controller is true but "
                           f"{CONTROLLERS_VAR} is not set: list the addresses gpufleet runs "
                           f"from{hint}, or set firewall_allow_controller: false")
        sources: list[str] = []
        for entry in listed:
            resolved = _resolve(str(entry))
            if not resolved:
                raise VarError(f"host {v.host.name}: {CONTROLLERS_VAR} entry {entry!r} is not "
                               "an address, a CIDR or a resolvable name")
            sources += resolved
        return sources

    def _port(self, v: RoleVars, value: Any, key: str = "firewall_open_tcp_ports") -> int:
        try:
            port = int(value)
        except (TypeError, ValueError):
            port = 0
        if isinstance(value, bool) or not 1 <= port <= 65535 or str(port) != str(value).strip():
            raise VarError(f"host {v.host.name}: {key} value {value!r} is not a TCP port "
                           "(1-65535)")
        return port

    def _cidr(self, v: RoleVars, text: Any, key: str) -> str:
        try:
            return str(ipaddress.ip_network(str(text), strict=False))
        except ValueError:
            raise VarError(f"host {v.host.name}: {key} entry {text!r} is not an address or "
                           "CIDR") from None

    def render(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> str:
        """The ruleset this host should run (nftables: without the cluster's addresses,
        which are in the cluster file)."""
        policy = v.string("firewall_policy")
        if policy not in ("drop", "accept"):
            raise VarError(f"host {v.host.name}: firewall_policy must be drop or accept")
        networks = self.cluster_networks(v, ctx)
        admin = [self._cidr(v, c, "firewall_ssh_cidrs") for c in v.items("firewall_ssh_cidrs")]
        if v.boolean("firewall_allow_controller"):
            admin += self.controllers(facts, v)
        low, high = parse_range(v.string("firewall_port_range"), v.host.name, "firewall_port_range")
        rendezvous = str(self._port(v, v.get("firewall_rendezvous_port"),
                                    "firewall_rendezvous_port"))
        extra = [str(self._port(v, p)) for p in v.items("firewall_open_tcp_ports")]
        ssh = str(v.host.port)
        header = HEADER.format(role=self.name)
        if v.string("firewall_backend") == "nftables":
            return self._render_nft(header, policy, [rendezvous, f"{low}-{high}", *extra],
                                    ssh, collapse(tuple(admin)))
        cluster = [*networks["ipv4"], *networks["ipv6"]]
        v6 = sorted({src for src in [*cluster, *admin] if ":" in src})
        if v6:
            raise VarError(f"host {v.host.name}: the iptables backend handles IPv4 only, but the "
                           f"firewall would admit {', '.join(v6)}; use firewall_backend: nftables")
        ssh_sources = collapse(tuple([*cluster, *admin]))["ipv4"]
        ports = [(rendezvous, cluster), (f"{low}:{high}", cluster), (ssh, ssh_sources),
                 *((p, cluster) for p in extra)]
        rules = [f"-p tcp -s {_prefixed(src)} --dport {port} -j ACCEPT"
                 for port, sources in ports for src in sources]
        return render("iptables.rules.j2", header=header, policy=policy, rules=rules)

    def _render_nft(self, header: str, policy: str, cluster_ports: list[str], ssh: str,
                    admin: dict[str, tuple[str, ...]]) -> str:
        sets: list[tuple[str, str, tuple[str, ...]]] = [
            (CLUSTER_SETS[f], f, ()) for f in CLUSTER_SETS]
        sets += [(ADMIN_SETS[f], f, admin[f]) for f in ADMIN_SETS if admin[f]]
        rules: list[str] = []
        for port in [*cluster_ports[:2], ssh, *cluster_ports[2:]]:
            for family, proto in (("ipv4", "ip"), ("ipv6", "ip6")):
                rules.append(f"tcp dport {port} {proto} saddr @{CLUSTER_SETS[family]} accept")
            if port == ssh:
                rules += [f"tcp dport {port} {proto} saddr @{ADMIN_SETS[family]} accept"
                          for family, proto in (("ipv4", "ip"), ("ipv6", "ip6"))
                          if admin[family]]
        return render("nftables.nft.j2", header=header, policy=policy, sets=sets, rules=rules,
                      cluster_file=CLUSTER_FILE)

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        backend = self.backend(v)
        content = self.render(facts, v, ctx)
        load = GuardedLoad(backend, content.encode(), v.integer("firewall_guard_seconds"))
        changes: list[Change] = []
        if backend.name == "nftables":
            data, digest = self.cluster_file(v, ctx)
            sets = digest_change(self.name, facts, CLUSTER_FILE, data, digest=digest,
                                 steps=[SetLoad(data)], mode=0o600)
            if sets is not None:
                changes.append(sets)
        ruleset = file_change(self.name, facts, backend.path, content, mode=0o600)
        if ruleset is not None:
            ruleset.steps = [load]
            changes.append(ruleset)
        else:
            live = self._live_problem(facts, backend)
            if live:
                changes.append(Change(self.name, f"live ruleset ({backend.name})", "reload",
                                      live, "as rendered", [load]))
            elif not changes:  # with the sets about to change, the live ones are stale
                changes += self._shadowing(facts, v, ctx)
        stale = self._other_backend(facts, backend)
        if stale:
            changes.append(stale)
        unit = render("gpufleet-firewall.service.j2", header=HEADER.format(role=self.name),
                      exec_start=backend.exec_start)
        for change in (file_change(self.name, facts, UNIT_PATH, unit),
                       link_change(self.name, facts, UNIT_LINK, "../gpufleet-firewall.service")):
            if change:
                changes.append(change)
        for change in changes:
            change.kind = "firewall"
        return changes

    def ports(self, v: RoleVars) -> list[tuple[int, int]]:
        """What the cluster must reach: the rendezvous port, the range, the extra ports."""
        rendezvous = self._port(v, v.get("firewall_rendezvous_port"), "firewall_rendezvous_port")
        low, high = parse_range(v.string("firewall_port_range"), v.host.name,
                                "firewall_port_range")
        extra = [self._port(v, p) for p in v.items("firewall_open_tcp_ports")]
        return [(rendezvous, rendezvous), (low, high), *((p, p) for p in extra)]

    def _shadowing(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        """Rules of the live ruleset that drop or reject the cluster's traffic gpufleet's
        table opens (another table of higher priority, a policy drop chain, iptables rules):
        one item per such rule, which gpufleet does not remove (it is not gpufleet's)."""
        live = facts.get("live_ruleset")
        if live is None:
            return []
        networks = self.cluster_networks(v, ctx)
        analysis = analyse_live(live, [*networks["ipv4"], *networks["ipv6"]], self.ports(v))
        by_rule: dict[str, list[str]] = {}
        for finding in analysis.blocked:
            assert finding.rule is not None
            ref = finding.rule.rule
            if ref.table == "table inet gpufleet" or ref.chain == "GPUFLEET-INPUT":
                continue  # gpufleet's own rules: their drift is the ruleset's or the sets'
            where = ref.where()
            key = f"{ref.table} chain {ref.chain}" + (f" {where}" if where else "")
            by_rule.setdefault(key, []).append(finding.message())
        return [Change(self.name, f"foreign rule in {key}", "verify", "; ".join(messages),
                       "no rule drops the cluster's traffic",
                       [Fail(f"a rule gpufleet does not own drops the cluster's traffic: "
                             f"{messages[0]}; remove it or open it for the cluster")],
                       kind="firewall")
                for key, messages in by_rule.items()]

    def _other_backend(self, facts: Facts, backend: Backend) -> Change | None:
        """gpufleet's rules of the backend not in use (left from a switch), to remove."""
        fw = facts.get("firewall") or {}
        if backend.name == "nftables" and fw.get("iptables_gpufleet_digest"):
            command = ("iptables -D INPUT -j GPUFLEET-INPUT 2>/dev/null; "
                       "iptables -F GPUFLEET-INPUT && iptables -X GPUFLEET-INPUT")
            return Change(self.name, "iptables rules (previous backend)", "remove", "present",
                          "absent", [Run(command, "remove the GPUFLEET-INPUT chain")])
        if backend.name == "iptables" and fw.get("nft_gpufleet_digest"):
            return Change(self.name, "nftables rules (previous backend)", "remove", "present",
                          "absent", [Run("nft delete table inet gpufleet",
                                         "delete table inet gpufleet")])
        return None

    def _live_problem(self, facts: Facts, backend: Backend) -> str | None:
        """Why the live ruleset is not the one gpufleet loaded, or None when it is."""
        fw = facts.get("firewall")
        if fw is None:
            return f"unknown ({facts.why_absent('firewall')})"
        key = "nft_gpufleet_digest" if backend.name == "nftables" else "iptables_gpufleet_digest"
        live = fw.get(key)
        if live is None:
            return "not loaded (gpufleet's rules are missing)"
        state = facts.file(STATE_FILE)
        try:
            recorded = json.loads(state.text).get("live_sha256") if state.exists else None
        except json.JSONDecodeError:
            recorded = None
        if recorded != live:
            return "changed since gpufleet loaded it"
        return None


ROLE = FirewallRole()
