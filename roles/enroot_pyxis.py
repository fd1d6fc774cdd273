"""enroot and pyxis for containers under Slurm: enroot's packages and pyxis (Slurm's SPANK
plugin, ``srun --container-image``) pinned like every other package, and enroot's settings
that matter for training declared in the inventory: the writable root filesystem, the
shared filesystems mounted into every container, the size of ``/dev/shm`` (NCCL's shared
memory transport), and the RDMA devices.

enroot reads ``/etc/enroot/enroot.conf.d/*.conf`` after its own ``enroot.conf`` and the
mounts of ``/etc/enroot/mounts.d/*.fstab`` in name order, so gpufleet's files (``90-``)
add to the packaged defaults without editing them. pyxis is enabled by a link in Slurm's
``plugstack.conf.d`` to the ``pyxis.conf`` its package installs; ``plugstack.conf`` must
include that directory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.provision import apt
from gpufleet.provision.managed import HEADER, file_change, link_change
from gpufleet.provision.plan import Change, Fail
from gpufleet.provision.role import SAFE_PATH, PlanContext, RoleBase, RoleVars, Var
from gpufleet.provision.standins import Standin

PYXIS_PACKAGE = "nvslurm-plugin-pyxis"
PYXIS_CONF = "/usr/share/pyxis/pyxis.conf"
_SETTING = re.compile(r"^ENROOT_[A-Z0-9_]+\Z")
_VALUE = re.compile(r"^[A-Za-z0-9._/:%$@{}+=,-]+\Z")
_SIZE = re.compile(r"^(\d+[kKmMgG]?|\d{1,2}%|100%)\Z")
_PATH_KEYS = ("enroot_config", "enroot_fstab", "pyxis_plugstack", "slurm_plugstack_conf")


class EnrootPyxisRole(RoleBase):
    name = "enroot_pyxis"
    order = 48
    variables: ClassVar[Mapping[str, Var]] = {
        "enroot_version": Var(None, "string", "enroot's package version, e.g. 3.5.0-1 (the "
                                              "role is on when set)"),
        "enroot_packages": Var(["enroot", "enroot+caps"], "list", "its packages"),
        "enroot_settings": Var({}, "mapping", "ENROOT_* settings, e.g. "
                                              "ENROOT_ROOTFS_WRITABLE: yes"),
        "enroot_mounts": Var(None, "list", "paths bind-mounted into every container "
                                           "(default: the shared_mounts paths)"),
        "enroot_shm_size": Var(None, "string", "size of the container's /dev/shm (64g, "
                                               "50%)"),
        "enroot_rdma": Var(False, "boolean", "/dev/infiniband in every container"),
        "enroot_config": Var("/etc/enroot/enroot.conf.d/90-gpufleet.conf", "string",
                             "the settings file"),
        "enroot_fstab": Var("/etc/enroot/mounts.d/90-gpufleet.fstab", "string",
                            "the mounts file"),
        "shared_mounts": Var(None, "list", "the shared filesystems (the mounts suite's)"),
        "pyxis_version": Var(None, "string", "pyxis's package version, e.g. 0.20.0-1"),
        "pyxis_plugstack": Var("/etc/slurm/plugstack.conf.d/pyxis.conf", "string",
                               "the link to pyxis.conf"),
        "slurm_plugstack_conf": Var("/etc/slurm/plugstack.conf", "string",
                                    "Slurm's plugstack.conf, which must include the link's "
                                    "directory"),
    }
    shared_keys = ("enroot", "pyxis")

    def active(self, v: RoleVars) -> bool:
        return v.get("enroot_version") is not None

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if not self.active(v):
            return
        self.wanted(v)
        for key in _PATH_KEYS:
            v.path(key)
        self.settings(v)
        self.mounts(v)
        size = v.opt_string("enroot_shm_size")
        if size is not None and not _SIZE.match(size):
            raise v.fail("enroot_shm_size", "a tmpfs size: a number with k, m or g, or a "
                         "percentage of memory (64g, 50%)", size)
        v.boolean("enroot_rdma")

    def wanted(self, v: RoleVars) -> dict[str, str]:
        packages = apt.templated(v, [str(p) for p in v.items("enroot_packages")],
                                 "enroot_version", {}, "enroot_packages")
        if "pyxis_version" in v:
            packages |= apt.templated(v, [PYXIS_PACKAGE], "pyxis_version", {},
                                      "pyxis_version")
        return packages

    def settings(self, v: RoleVars) -> dict[str, str]:
        """The ENROOT_* settings, validated (each becomes a ``KEY value`` line), by name."""
        found: dict[str, str] = {}
        for key, value in v.mapping("enroot_settings").items():
            text = _word(value)
            if not _SETTING.match(str(key)) or text is None or not _VALUE.match(text):
                raise VarError(f"host {v.host.name}: enroot_settings {key}: a key ENROOT_* "
                               f"and one word of letters, digits and ._/:%$@{{}}+=,- as its "
                               f"value, got {value!r}")
            found[str(key)] = text
        return dict(sorted(found.items()))

    def mounts(self, v: RoleVars) -> list[str]:
        """The paths bind-mounted into every container."""
        if v.get("enroot_mounts") is not None:
            paths = [str(p) for p in v.items("enroot_mounts")]
            key = "enroot_mounts"
        else:
            key = "shared_mounts"
            mounts = v.items(key)
            wrong = next((m for m in mounts if not isinstance(m, dict)), None)
            if wrong is not None:
                raise v.fail(key, "a list of mounts, each a mapping with a path", wrong)
            paths = [str(m.get("path")) for m in mounts]
        for path in paths:
            if not SAFE_PATH.match(path):
                raise v.fail(key, "absolute paths of letters, digits and . _ - /", path)
        return paths

    def fstab(self, v: RoleVars) -> str:
        lines = [f"# {HEADER.format(role=self.name)}"]
        lines += [f"{p} {p} none x-create=dir,bind,rw,nosuid,nodev" for p in self.mounts(v)]
        size = v.opt_string("enroot_shm_size")
        if size is not None:
            lines.append(f"tmpfs /dev/shm tmpfs x-create=dir,rw,nosuid,nodev,size={size}")
        if v.boolean("enroot_rdma"):
            lines.append("/dev/infiniband /dev/infiniband none x-create=dir,bind,rw,nosuid")
        return "\n".join(lines) + "\n"

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        files = {"apt pin": apt.pin_path(self.name), "settings": v.string("enroot_config"),
                 "mounts": v.string("enroot_fstab")}
        if "pyxis_version" in v:
            files["pyxis link"] = v.string("pyxis_plugstack")
        return files

    def request(self, v: RoleVars) -> FactRequest:
        files = {apt.pin_path(self.name), v.string("enroot_config"), v.string("enroot_fstab")}
        links = set()
        if "pyxis_version" in v:
            files.add(v.string("slurm_plugstack_conf"))
            links.add(v.string("pyxis_plugstack"))
        return FactRequest(packages=frozenset(self.wanted(v)), files=frozenset(files),
                           links=frozenset(links))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        changes = apt.pinned_packages(self.name, facts, self.wanted(v))
        header = HEADER.format(role=self.name)
        settings = "".join(f"{k} {value}\n" for k, value in self.settings(v).items())
        for path, content in ((v.string("enroot_config"), f"# {header}\n{settings}"),
                              (v.string("enroot_fstab"), self.fstab(v))):
            change = file_change(self.name, facts, path, content)
            changes += [change] if change else []
        if "pyxis_version" in v:
            changes += self._pyxis(facts, v)
        return changes

    def _pyxis(self, facts: Facts, v: RoleVars) -> list[Change]:
        link = v.string("pyxis_plugstack")
        directory = link.rsplit("/", 1)[0]
        change = link_change(self.name, facts, link, PYXIS_CONF)
        changes = [change] if change else []
        plugstack = facts.file(v.string("slurm_plugstack_conf"))
        includes = [line.split(None, 1)[1].strip() for line in plugstack.text.splitlines()
                    if line.strip().startswith("include ") and len(line.split()) > 1]
        if not any(i.rstrip("/*").rstrip("/") == directory for i in includes):
            found = "absent" if not plugstack.exists else "without the include"
            changes.append(Change(self.name, f"plugstack {plugstack.path}", "verify", found,
                                  f"include {directory}/*", [Fail(
                                      f"{plugstack.path} must include {directory}/* for "
                                      f"Slurm to load pyxis: add the line 'include "
                                      f"{directory}/*' (slurm.conf's PlugStackConfig names "
                                      "the file)")], kind="plugstack"))
        return changes

    def shared_request(self, v: RoleVars) -> FactRequest:
        return FactRequest(packages=frozenset({"enroot", PYXIS_PACKAGE}))

    def shared(self, facts: Facts, v: RoleVars) -> dict[str, str | None]:
        packages = facts.get("packages") or {}
        return {key: (packages.get(name) or {}).get("version")
                if (packages.get(name) or {}).get("installed") else None
                for key, name in (("enroot", "enroot"), ("pyxis", PYXIS_PACKAGE))}

    def standins(self) -> list[Standin]:
        return [pkg for version in ("3.5.0-1", "4.0.1-1") for pkg in _enroot_standins(version)] \
            + [_pyxis_standin(version) for version in ("0.20.0-1", "0.21.0-1")]


def _word(value: Any) -> str | None:
    """A setting's value as enroot.conf writes it (booleans as yes/no), None for none."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None or isinstance(value, (dict, list)):
        return None
    return str(value)


def _enroot_standins(version: str) -> list[Standin]:
    """enroot and enroot+caps (its capabilities for unprivileged use) at one version, as
    NVIDIA's release assets name them (enroot_3.5.0-1_amd64.deb, enroot+caps_...)."""
    upstream = version.split("-", maxsplit=1)[0]
    return [
        Standin("enroot", version, "Unprivileged container sandboxing utility",
                files={"/usr/bin/enroot": f"#!/bin/sh\n[ \"$1\" = version ] && echo {upstream}"
                                          " && exit 0\necho 'lab enroot: not provided' >&2\n"
                                          "exit 2\n",
                       "/etc/enroot/mounts.d/10-system.fstab":
                           "tmpfs /dev/shm tmpfs x-create=dir,rw,nosuid,nodev\n"},
                executables=frozenset({"/usr/bin/enroot"})),
        Standin("enroot+caps", version, "Unprivileged container sandboxing utility (extra "
                "capabilities)", depends=f"enroot (= {version})"),
    ]


def _pyxis_standin(version: str) -> Standin:
    """pyxis as its own ``make deb`` packages it: the plugin and the pyxis.conf naming it."""
    plugin = "/usr/lib/x86_64-linux-gnu/slurm/spank_pyxis.so"
    return Standin(PYXIS_PACKAGE, version, "Pyxis is a SPANK plugin for the SLURM workload "
                   "manager", files={PYXIS_CONF: f"required {plugin}\n",
                                     plugin: "gpufleet lab stand-in (not a shared object)\n"})


ROLE = EnrootPyxisRole()
