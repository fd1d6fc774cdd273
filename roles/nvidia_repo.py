"""NVIDIA's CUDA apt repository: its keyring, a sources entry that trusts only that keyring,
and a pin by origin, so that no other archive replaces NVIDIA's packages.

The URL is NVIDIA's (``https://developer.download.nvidia.com/compute/cuda/repos/<distro>/
<arch>/``, a flat repository) or a mirror's, from the inventory. The keyring is a file on
the controller (NVIDIA's ``cuda-archive-keyring.gpg``, or the mirror's). The pin gives
every package of a release labelled ``NVIDIA CUDA`` priority 600, as NVIDIA's own pin file
does: above the distribution's archive (500), below the exact pins of the other roles.
The lab serves its stand-in repository at NVIDIA's layout, signed by the lab's own key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.provision.managed import HEADER, file_change, render
from gpufleet.provision.plan import Change
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var

DEFAULT_URL = "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/{arch}/"
_URL = re.compile(r"^(https?://|file:/)[A-Za-z0-9._~:/?#@!$&()*+,;=%-]+\Z")


class NvidiaRepoRole(RoleBase):
    name = "nvidia_repo"
    order = 10
    variables: ClassVar[Mapping[str, Var]] = {
        "nvidia_repo": Var(False, "boolean", "manage NVIDIA's CUDA apt repository"),
        "nvidia_repo_url": Var(DEFAULT_URL, "string", "the repository (NVIDIA's or a mirror)"),
        "nvidia_repo_keyring": Var(None, "string", "the keyring file on the controller"),
        "nvidia_repo_keyring_path": Var("/usr/share/keyrings/cuda-archive-keyring.gpg",
                                        "string", "where the keyring goes on the host"),
        "nvidia_repo_list": Var("/etc/apt/sources.list.d/cuda.list", "string",
                                "the sources entry"),
        "nvidia_repo_pin": Var("/etc/apt/preferences.d/cuda-repository-pin-600", "string",
                               "the pin file"),
        "nvidia_repo_pin_priority": Var(600, "integer", "priority of NVIDIA's packages"),
    }

    def active(self, v: RoleVars) -> bool:
        return v.boolean("nvidia_repo")

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if not self.active(v):
            return
        for key in ("nvidia_repo_keyring_path", "nvidia_repo_list", "nvidia_repo_pin"):
            v.path(key)
        if not 1 <= v.integer("nvidia_repo_pin_priority") <= 990:
            raise v.fail("nvidia_repo_pin_priority", "1-990 (above 990 would downgrade "
                         "installed packages)", v.get("nvidia_repo_pin_priority"))
        self.keyring(v)
        # the URL as a host of Ubuntu 24.04 would fill it in: a bad one is refused here,
        # before any host, not when the host's plan is made
        self.url(Facts(v.host.name, values={"os_release": {"ID": "ubuntu",
                                                           "VERSION_ID": "24.04"}}), v)

    def keyring(self, v: RoleVars) -> bytes:
        """The keyring's bytes, read on the controller."""
        path = v.opt_string("nvidia_repo_keyring")
        if path is None:
            raise VarError(f"host {v.host.name}: nvidia_repo is true but nvidia_repo_keyring "
                           "is not set: name the repository's keyring file on the controller "
                           "(NVIDIA's cuda-archive-keyring.gpg)")
        try:
            return Path(path).expanduser().read_bytes()
        except OSError as exc:
            raise VarError(f"host {v.host.name}: variable nvidia_repo_keyring: cannot read "
                           f"{path}: {exc.strerror or exc}") from None

    def url(self, facts: Facts, v: RoleVars) -> str:
        """The repository's URL, with {distro} (ubuntu2404, debian12) and {arch} (x86_64,
        sbsa) filled in from the host's facts."""
        release = facts.get("os_release") or {}
        machine = facts.get("arch") or "x86_64"
        fields = {"distro": f"{release.get('ID', '')}{release.get('VERSION_ID', '')}"
                            .replace(".", ""),
                  "arch": "sbsa" if machine == "aarch64" else machine}
        try:
            url = v.string("nvidia_repo_url").format(**fields)
        except (KeyError, IndexError, ValueError) as exc:
            raise VarError(f"host {v.host.name}: nvidia_repo_url has a bad placeholder "
                           f"({exc}); use {{distro}} and {{arch}}") from None
        if not _URL.match(url):
            raise VarError(f"host {v.host.name}: variable nvidia_repo_url must be an http(s) "
                           f"or file: URL without spaces or quotes, got {url!r}")
        return url if url.endswith("/") else url + "/"

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {k: v.string(k) for k in ("nvidia_repo_keyring_path", "nvidia_repo_list",
                                         "nvidia_repo_pin")}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(files=frozenset({v.string("nvidia_repo_keyring_path"),
                                            v.string("nvidia_repo_list"),
                                            v.string("nvidia_repo_pin")}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        header = HEADER.format(role=self.name)
        keyring = v.string("nvidia_repo_keyring_path")
        sources = render("cuda.list.j2", header=header, keyring=keyring, url=self.url(facts, v))
        pin = render("cuda-repository-pin.j2", header=header,
                     priority=v.integer("nvidia_repo_pin_priority"))
        changes = [file_change(self.name, facts, keyring, self.keyring(v)),
                   file_change(self.name, facts, v.string("nvidia_repo_list"), sources),
                   file_change(self.name, facts, v.string("nvidia_repo_pin"), pin)]
        found = [c for c in changes if c is not None]
        for change in found:
            change.kind = "apt-repo"
        return found


ROLE = NvidiaRepoRole()
