"""NVIDIA Container Toolkit: its four packages at one exact version, held and pinned, the
runtime configured for the container engine the inventory names, and the CDI spec of the
node's GPUs kept in step with the driver.

The engine's configuration is written by the toolkit's own ``nvidia-ctk runtime configure``
(Docker's daemon.json, containerd's config.toml), never by a template: the file keeps the
settings it already has. gpufleet reads the result back and reports a file without the
``nvidia`` runtime (or where it is not the default, when asked) as drift. Podman has no
runtime to configure: it reaches the GPUs through CDI (``--device nvidia.com/gpu=all``).

The CDI spec (``nvidia-ctk cdi generate``) mounts the driver's versioned libraries. A spec
of another driver than the node's, or one missing a GPU, is stale: containers asking for
``nvidia.com/gpu`` then fail to start. It is regenerated, and drift reports it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import ClassVar

from gpufleet.facts import containers
from gpufleet.facts.catalog import SYSTEMD
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.provision import apt
from gpufleet.provision.plan import Change, Fail, Run, Step
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var
from gpufleet.provision.standins import Standin
from gpufleet.roles.container_toolkit_standin import toolkit_standins
from gpufleet.roles.driver import driver_version

ENGINES = ("docker", "podman", "containerd")
PACKAGES = ["nvidia-container-toolkit", "nvidia-container-toolkit-base",
            "libnvidia-container-tools", "libnvidia-container1"]
ENGINE_CONFIG = {"docker": "/etc/docker/daemon.json",
                 "containerd": "/etc/containerd/config.toml"}
READERS = {"docker": containers.docker_runtime, "containerd": containers.containerd_runtime}
CDI_KIND = "nvidia.com/gpu"


class ContainerToolkitRole(RoleBase):
    name = "container_toolkit"
    order = 47
    variables: ClassVar[Mapping[str, Var]] = {
        "container_engine": Var(None, "string", "docker, podman or containerd (the role is "
                                                "on when set)"),
        "nvidia_container_toolkit_version": Var(None, "string", "the toolkit's package "
                                                                "version, e.g. 1.17.8-1"),
        "nvidia_container_toolkit_packages": Var(PACKAGES, "list", "the packages, all at "
                                                                   "that version"),
        "container_engine_config": Var(None, "string", "the engine's configuration file "
                                                       "(default: the engine's own)"),
        "container_default_runtime": Var(False, "boolean", "make nvidia the engine's "
                                                           "default runtime"),
        "nvidia_cdi": Var(True, "boolean", "generate the CDI spec of the node's GPUs"),
        "nvidia_cdi_spec": Var("/etc/cdi/nvidia.yaml", "string", "where the spec goes"),
        "nvidia_driver_version": Var(None, "string", "the driver the CDI spec must name "
                                                     "(default: the loaded module's)"),
    }
    shared_keys = ("container_toolkit",)

    def active(self, v: RoleVars) -> bool:
        return v.get("container_engine") is not None

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if not self.active(v):
            return
        engine = v.string("container_engine")
        if engine not in ENGINES:
            raise v.fail("container_engine", " or ".join(ENGINES), engine)
        if "nvidia_container_toolkit_version" not in v:
            raise v.fail("nvidia_container_toolkit_version", "set when container_engine is "
                         "(the toolkit is pinned like every NVIDIA package), e.g. 1.17.8-1",
                         None)
        self.wanted(v)
        if engine == "podman" and not v.boolean("nvidia_cdi"):
            raise v.fail("nvidia_cdi", "true with podman (podman reaches the GPUs through "
                         "CDI only)", v.get("nvidia_cdi"))
        if engine == "podman" and v.get("container_engine_config") is not None:
            raise v.fail("container_engine_config", "unset with podman (podman has no runtime "
                         "to configure: it reaches the GPUs through CDI)",
                         v.get("container_engine_config"))
        v.boolean("container_default_runtime")
        for key in ("nvidia_cdi_spec", "container_engine_config"):
            if v.opt_string(key) is not None:
                v.path(key)
        if v.opt_string("nvidia_driver_version") is not None:
            driver_version(v)

    def wanted(self, v: RoleVars) -> dict[str, str]:
        return apt.templated(v, [str(p) for p in v.items("nvidia_container_toolkit_packages")],
                             "nvidia_container_toolkit_version", {},
                             "nvidia_container_toolkit_packages")

    def engine_config(self, v: RoleVars) -> str | None:
        """The engine's configuration file (None for podman, which has none to set)."""
        engine = v.string("container_engine")
        return v.opt_string("container_engine_config") or ENGINE_CONFIG.get(engine)

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        files = {"apt pin": apt.pin_path(self.name)}
        if v.boolean("nvidia_cdi"):
            files["CDI spec"] = v.string("nvidia_cdi_spec")
        return files

    def request(self, v: RoleVars) -> FactRequest:
        files = {apt.pin_path(self.name), v.string("nvidia_cdi_spec")}
        config = self.engine_config(v)
        if config is not None:
            files.add(config)
        return FactRequest(packages=frozenset(self.wanted(v)), files=frozenset(files),
                           custom=frozenset({SYSTEMD}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        changes = apt.pinned_packages(self.name, facts, self.wanted(v))
        runtime = self._runtime(facts, v)
        if runtime is not None:
            changes.append(runtime)
        if v.boolean("nvidia_cdi"):
            spec = self._cdi(facts, v)
            if spec is not None:
                changes.append(spec)
        return changes

    def _runtime(self, facts: Facts, v: RoleVars) -> Change | None:
        engine, path = v.string("container_engine"), self.engine_config(v)
        if path is None:
            return None
        default = v.boolean("container_default_runtime")
        state = facts.file(path)
        want = "nvidia runtime" + (" (the default)" if default else "")
        try:
            found = READERS[engine](state.text if state.exists else "")
        except containers.ConfigError as exc:
            return Change(self.name, f"runtime {engine}", "verify", f"{path}: {exc}", want,
                          [Fail(f"{path} cannot be read ({exc}): nvidia-ctk would not "
                                "configure it either; mend the file")], kind="runtime")
        binary_ok = found.binary is not None and \
            found.binary.rsplit("/", 1)[-1] == containers.RUNTIME_BINARY
        if found.present and binary_ok and (found.default or not default):
            return None
        before = ("no nvidia runtime" if not found.present else
                  f"nvidia runtime at {found.binary}" if not binary_ok else
                  "nvidia runtime (not the default)")
        command = (f"nvidia-ctk runtime configure --runtime={engine} "
                   f"--config={shlex.quote(path)}" + (" --set-as-default" if default else ""))
        steps: list[Step] = [Run(command, f"nvidia-ctk runtime configure --runtime={engine}",
                                 timeout=120)]
        if facts.get("systemd"):
            steps.append(Run(f"systemctl try-restart {engine}.service",
                             f"restart {engine} if it runs", timeout=300))
        return Change(self.name, f"runtime {engine}", "configure", f"{path}: {before}",
                      f"{path}: {want}", steps, kind="runtime")

    def _cdi(self, facts: Facts, v: RoleVars) -> Change | None:
        path = v.string("nvidia_cdi_spec")
        driver = driver_version(v) if v.opt_string("nvidia_driver_version") is not None \
            else facts.get("nvidia_module")
        gpus = facts.get("gpu_list") or []
        uuids = sorted(str(g["uuid"]) for g in gpus if g.get("uuid"))
        state = facts.file(path)
        if not state.exists:
            before = "absent"
        else:
            try:
                spec = containers.cdi_spec(state.text)
            except containers.ConfigError as exc:
                spec, before = None, f"unreadable ({exc})"
            if spec is not None:
                stale = [f"driver {spec.driver or 'not named'}"] if spec.driver != driver \
                    else []
                missing = [u for u in uuids if u not in spec.uuids]
                stale += [f"without {', '.join(missing)}"] if missing else []
                stale += [f"kind {spec.kind}"] if spec.kind != CDI_KIND else []
                if not stale:
                    return None
                before = "; ".join(stale)
        after = f"driver {driver}, {len(uuids)} GPU(s)"
        if driver is None:
            return Change(self.name, f"cdi spec {path}", "generate", before, "the driver's",
                          [Fail("no NVIDIA driver is loaded: the CDI spec cannot be generated "
                                f"({facts.why_absent('nvidia_module')})")], kind="cdi")
        # the driver as the spec names it: the hook's argument, else libcuda's mount
        check = (f"grep -q -e {shlex.quote('--host-driver-version=' + driver)} "
                 f"-e {shlex.quote('libcuda.so.' + driver)} {shlex.quote(path)}")
        mismatch = shlex.quote(f"the generated spec is not of driver {driver} (the loaded "
                               "driver differs: reboot into it)")
        command = (f"nvidia-ctk cdi generate --output={shlex.quote(path)} >/dev/null && "
                   f"{{ {check} || {{ echo {mismatch} >&2; exit 1; }}; }}")
        return Change(self.name, f"cdi spec {path}", "generate", before, after,
                      [Run(command, f"nvidia-ctk cdi generate --output={path}", timeout=300)],
                      kind="cdi")

    def shared_request(self, v: RoleVars) -> FactRequest:
        return FactRequest(packages=frozenset({PACKAGES[0]}))

    def shared(self, facts: Facts, v: RoleVars) -> dict[str, str | None]:
        record = (facts.get("packages") or {}).get(PACKAGES[0]) or {}
        return {"container_toolkit": record.get("version") if record.get("installed") else None}

    def standins(self) -> list[Standin]:
        return toolkit_standins(("1.17.8-1", "1.18.0-1"))


ROLE = ContainerToolkitRole()
