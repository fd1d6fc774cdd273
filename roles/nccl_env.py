"""NCCL configuration: /etc/nccl.conf, an environment file for launchers, and the local
port range that keeps NCCL's ephemeral ports inside the firewall's open range.

Linux defaults to 32768-60999, so without this NCCL picks ports outside
49152-65535 and hangs behind a firewall that opens only that range.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping
from typing import ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.ports import PORT_RANGE, parse_range
from gpufleet.provision.managed import HEADER, file_change, render
from gpufleet.provision.plan import Change, Run
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var

PORT_RANGE_KEY = "net.ipv4.ip_local_port_range"
_ENV_KEY = re.compile(r"^[A-Z][A-Z0-9_]*\Z")
_IFNAMES = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]*(?:,[A-Za-z0-9][A-Za-z0-9_.:@-]*)*\Z")


class NcclEnvRole(RoleBase):
    name = "nccl_env"
    order = 70
    variables: ClassVar[Mapping[str, Var]] = {
        "nccl_env": Var(None, "mapping", "NCCL_* settings for nccl.conf and the env file"),
        "gloo_socket_ifname": Var(None, "string", "GLOO_SOCKET_IFNAME (default: "
                                                   "NCCL_SOCKET_IFNAME)"),
        "nccl_conf_path": Var("/etc/nccl.conf", "string", "where nccl.conf lives"),
        "nccl_env_file": Var("/etc/default/gpufleet-nccl", "string", "the env file"),
        "nccl_profile_script": Var("/etc/profile.d/gpufleet-nccl.sh", "string",
                                   "the login-shell script sourcing the env file"),
        "nccl_sysctl_file": Var("/etc/sysctl.d/60-gpufleet-nccl.conf", "string",
                                "the sysctl file of the local port range"),
        "nccl_local_port_range": Var(None, "string", "the local port range (default: "
                                                      "firewall_port_range)"),
        "firewall_port_range": Var(PORT_RANGE, "string", "the firewall's open range"),
    }
    shared_keys = ("nccl_conf", "port_range")

    def active(self, v: RoleVars) -> bool:
        return v.get("nccl_env") is not None

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if not self.active(v):
            return
        for key in ("nccl_conf_path", "nccl_env_file", "nccl_profile_script",
                    "nccl_sysctl_file"):
            v.path(key, "it is written into the profile script and run by sysctl")
        self.settings(v)
        self.port_range(v)
        gloo = v.opt_string("gloo_socket_ifname")
        if gloo is not None and not _IFNAMES.match(gloo):
            raise v.fail("gloo_socket_ifname", "interface names separated by commas (eth0, "
                         "ens1f0np0)", gloo)

    def settings(self, v: RoleVars) -> dict[str, str]:
        """NCCL_* settings as the inventory sets them, validated, sorted by name: the
        rendered files never depend on the order of the source (``ansible-inventory
        --list`` sorts mapping keys; a YAML file keeps its own)."""
        settings = {}
        for key, value in v.mapping("nccl_env").items():
            if value is None or isinstance(value, (dict, list)):
                raise VarError(f"host {v.host.name}: nccl_env {key} must be a single value, "
                               f"got {value!r}")
            text = str(value).lower() if isinstance(value, bool) else str(value)
            if not _ENV_KEY.match(str(key)):
                raise VarError(f"host {v.host.name}: nccl_env key {key!r} is not a valid "
                               "environment variable name")
            if any(ch in text for ch in "\n\r\0"):
                raise VarError(f"host {v.host.name}: nccl_env {key} contains a line break")
            settings[str(key)] = text
        return dict(sorted(settings.items()))

    def port_range(self, v: RoleVars) -> str:
        """The local port range: the inventory's, else the firewall's open range."""
        own = v.opt_string("nccl_local_port_range")
        low, high = parse_range(own or v.string("firewall_port_range"), v.host.name,
                                "nccl_local_port_range" if own else "firewall_port_range")
        open_low, open_high = parse_range(v.string("firewall_port_range"), v.host.name,
                                          "firewall_port_range")
        if not (open_low <= low and high <= open_high):
            raise VarError(f"host {v.host.name}: nccl_local_port_range {low}-{high} lies "
                           f"outside firewall_port_range {open_low}-{open_high}; NCCL would "
                           "pick ports the firewall closes")
        return f"{low} {high}"

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {k: v.string(k) for k in ("nccl_conf_path", "nccl_env_file",
                                         "nccl_profile_script", "nccl_sysctl_file")}

    def request(self, v: RoleVars) -> FactRequest:
        files = {v.string(k) for k in ("nccl_conf_path", "nccl_env_file", "nccl_profile_script",
                                    "nccl_sysctl_file")}
        return FactRequest(files=frozenset(files), sysctls=frozenset({PORT_RANGE_KEY}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        header = HEADER.format(role=self.name)
        settings = self.settings(v)
        env = dict(settings)
        gloo = v.opt_string("gloo_socket_ifname") or settings.get("NCCL_SOCKET_IFNAME")
        if gloo:
            env["GLOO_SOCKET_IFNAME"] = gloo
        env = dict(sorted(env.items()))
        port_range = self.port_range(v)
        env_file = v.string("nccl_env_file")
        files = [
            (v.string("nccl_conf_path"), render("nccl.conf.j2", header=header, settings=settings)),
            (env_file, render("nccl-env.j2", header=header, settings=env)),
            (v.string("nccl_profile_script"), render("nccl-profile.sh.j2", header=header,
                                                  env_file=env_file)),
            (v.string("nccl_sysctl_file"), render("sysctl-nccl.conf.j2", header=header,
                                               sysctls={PORT_RANGE_KEY: port_range})),
        ]
        changes = [c for path, content in files
                   if (c := file_change(self.name, facts, path, content)) is not None]
        live = facts.sysctl(PORT_RANGE_KEY)
        if live != port_range:
            command = f"sysctl -q -w {PORT_RANGE_KEY}={shlex.quote(port_range)}"
            changes.append(Change(self.name, f"sysctl {PORT_RANGE_KEY}", "set", live,
                                  port_range, [Run(command, f"sysctl {PORT_RANGE_KEY}")]))
        return changes

    def shared_request(self, v: RoleVars) -> FactRequest:
        return FactRequest(files=frozenset({v.string("nccl_conf_path")}))

    def shared(self, facts: Facts, v: RoleVars) -> dict[str, str | None]:
        values: dict[str, str | None] = {
            "port_range": " ".join(map(str, facts.get("port_range") or ())) or None}
        conf = facts.values.get(f"file:{v.string('nccl_conf_path')}")
        if conf is not None:
            values["nccl_conf"] = (hashlib.sha256(conf.content).hexdigest()[:12]
                                   if conf.exists else "absent")
        return values

    def provides(self, v: RoleVars) -> dict[str, str]:
        return {"nccl_conf": v.string("nccl_conf_path"), "nccl_env_file": v.string(
            "nccl_env_file")}


ROLE = NcclEnvRole()
