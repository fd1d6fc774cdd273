"""The node side of Slurm that a training job depends on: the locked-memory and open-files
limits of jobs and logins, gres.conf and cgroup.conf where the inventory hands them to
gpufleet, and the slurm.conf settings training needs, reported (never written).

A job's processes get slurmd's limits, and systemd sets slurmd's: limits.conf only reaches
login sessions. A node whose ssh sessions have an unlimited memlock while slurmd runs with
systemd's 8 MiB (or the submitting shell's 64 KiB, which slurm.conf propagates by default)
is the classic "NCCL works over ssh but not under srun": ibv_reg_mr fails and NCCL falls
back to sockets or aborts. The role writes both, and restarts slurmd when the running one
has other limits.

slurm.conf is the cluster's, the same on every node, owned by whoever runs Slurm: gpufleet
reads it and reports each setting training needs that it lacks as a manual change, which
provisioning shows and leaves to an operator and drift reports.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.catalog import SYSTEMD
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.slurmd import SLURMD, Setting, SlurmConf, Slurmd, conf_fact
from gpufleet.provision.managed import HEADER, file_change, render
from gpufleet.provision.plan import MANUAL, Change, Fail, Run, Step
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var

LIMITS_FILE = "/etc/security/limits.d/90-gpufleet-slurm.conf"
DROPIN = "/etc/systemd/system/slurmd.service.d/gpufleet-limits.conf"
NR_OPEN = "fs.nr_open"
NR_OPEN_MAX = 2147483584  # the kernel's ceiling of fs.nr_open on 64-bit (INT_MAX & -64)
LEAST_NOFILE = 1024
MAX_MEMLOCK_KIB = (2**63 - 1) // 1024
CGROUP_DEFAULTS = {"ConstrainCores": "yes", "ConstrainDevices": "yes",
                   "ConstrainRAMSpace": "yes"}
# PrologFlags that run the prolog at allocation: Alloc, and those that imply it
ALLOC_FLAGS = {"alloc", "contain", "deferbatch", "nohold", "forcerequeueonfail", "runinjob",
               "x11"}
_TYPE = re.compile(r"^(?!\d+\Z)[A-Za-z0-9][A-Za-z0-9_.+-]*\Z")
_CGROUP_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9]*\Z")
_CGROUP_VALUE = re.compile(r"^[A-Za-z0-9_./:%,+][A-Za-z0-9_./:%,+-]*\Z")


class SlurmNodeRole(RoleBase):
    name = "slurm_node"
    order = 75
    variables: ClassVar[Mapping[str, Var]] = {
        "slurm_node": Var(False, "boolean", "manage the node side of Slurm"),
        "slurm_job_memlock": Var("unlimited", "any", "locked memory of jobs and logins: "
                                                     "unlimited, or KiB"),
        "slurm_job_nofile": Var(131072, "integer", "open files of jobs and logins"),
        "slurm_conf_dir": Var("/etc/slurm", "string", "Slurm's configuration directory"),
        "slurm_conf_check": Var(True, "boolean", "report the slurm.conf settings training "
                                                 "needs"),
        "slurm_gres_conf_manage": Var(False, "boolean", "write gres.conf from the node's "
                                                        "GPUs"),
        "slurm_gres_autodetect": Var(False, "boolean", "gres.conf is AutoDetect=nvml"),
        "slurm_gres_type": Var(None, "string", "the GPUs' GRES type: a name, or model "
                                               "(from the GPU's model)"),
        "slurm_cgroup_conf_manage": Var(False, "boolean", "write cgroup.conf"),
        "slurm_cgroup_conf": Var({}, "mapping", "cgroup.conf settings over the defaults "
                                                "(null drops one)"),
        "slurm_prolog": Var(False, "boolean", "slurm.conf runs the gpufleet prolog"),
        "slurm_prolog_path": Var("/usr/local/sbin/gpufleet-prolog", "string",
                                 "the prolog program"),
        "slurm_epilog": Var(False, "boolean", "slurm.conf runs the gpufleet epilog"),
        "slurm_epilog_path": Var("/usr/local/sbin/gpufleet-epilog", "string",
                                 "the epilog program"),
        "gpu_count": Var(None, "integer", "GPUs the node must have: gres.conf is never "
                                          "written for fewer"),
    }

    def active(self, v: RoleVars) -> bool:
        return v.boolean("slurm_node")

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if not self.active(v):
            return
        self.memlock_kib(v)
        self.nofile(v)
        for key in ("slurm_conf_dir", "slurm_prolog_path", "slurm_epilog_path"):
            v.path(key)
        for key in ("slurm_conf_check", "slurm_gres_conf_manage", "slurm_gres_autodetect",
                    "slurm_cgroup_conf_manage", "slurm_prolog", "slurm_epilog"):
            v.boolean(key)
        self.gres_type(v)
        self.cgroup_settings(v)
        self.gpu_count(v)

    # ---- variables ------------------------------------------------------------------------

    @staticmethod
    def memlock_kib(v: RoleVars) -> int | None:
        """slurm_job_memlock in KiB, None for unlimited."""
        value = v.get("slurm_job_memlock")
        if value == "unlimited":
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            kib = value
        elif isinstance(value, str) and value.isascii() and value.isdigit():
            kib = int(value)
        else:
            kib = 0
        if not 1 <= kib <= MAX_MEMLOCK_KIB:
            raise v.fail("slurm_job_memlock", "unlimited or a positive number of KiB (65536 "
                         "for 64 MiB)", value)
        return kib

    @staticmethod
    def nofile(v: RoleVars) -> int:
        value = v.integer("slurm_job_nofile")
        if isinstance(v.get("slurm_job_nofile"), float) or \
                not LEAST_NOFILE <= value <= NR_OPEN_MAX:
            raise v.fail("slurm_job_nofile", f"a whole number of open files from "
                         f"{LEAST_NOFILE} to {NR_OPEN_MAX}", v.get("slurm_job_nofile"))
        return value

    @staticmethod
    def gres_type(v: RoleVars) -> str | None:
        """The GRES type: None (no Type=), ``model``, or a type name."""
        value = v.opt_string("slurm_gres_type")
        if value is None:
            return None
        if not _TYPE.match(value):
            raise v.fail("slurm_gres_type", "model, or a GRES type name (letters, digits and "
                         "_ . + -, not a number, e.g. h200)", v.get("slurm_gres_type"))
        if v.boolean("slurm_gres_autodetect"):
            raise v.fail("slurm_gres_type", "unset with slurm_gres_autodetect (NVML names "
                         "the types)", value)
        return value

    @staticmethod
    def cgroup_settings(v: RoleVars) -> dict[str, str]:
        """cgroup.conf's settings: the defaults, then the inventory's (by key, any case;
        null drops one), sorted by name."""
        settings = {key.lower(): (key, value) for key, value in CGROUP_DEFAULTS.items()}
        for key, value in v.mapping("slurm_cgroup_conf").items():
            text = ("yes" if value else "no") if isinstance(value, bool) else \
                None if value is None or isinstance(value, (dict, list)) else str(value)
            if not _CGROUP_KEY.match(str(key)) or (value is not None and (
                    text is None or not _CGROUP_VALUE.match(text))):
                raise VarError(f"host {v.host.name}: slurm_cgroup_conf {key}: a cgroup.conf "
                               "key (ConstrainRAMSpace) and one word of letters, digits and "
                               f"_ . / : % , + - as its value, got {value!r}")
            if value is None:
                settings.pop(str(key).lower(), None)
            else:
                settings[str(key).lower()] = (str(key), text or "")
        return dict(sorted(settings.values(), key=lambda kv: kv[0].lower()))

    @staticmethod
    def gpu_count(v: RoleVars) -> int | None:
        if v.get("gpu_count") is None:
            return None
        count = v.integer("gpu_count")
        if count < 0:
            raise v.fail("gpu_count", "0 or more", count)
        return count

    def paths(self, v: RoleVars) -> dict[str, str]:
        """The files the role writes, by what they are."""
        d = v.string("slurm_conf_dir").rstrip("/")
        files = {"limits": LIMITS_FILE, "slurmd drop-in": DROPIN}
        if v.boolean("slurm_gres_conf_manage"):
            files["slurm_gres_conf_manage"] = f"{d}/gres.conf"
        if v.boolean("slurm_cgroup_conf_manage"):
            files["slurm_cgroup_conf_manage"] = f"{d}/cgroup.conf"
        return files

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return self.paths(v)

    def request(self, v: RoleVars) -> FactRequest:
        custom = {SYSTEMD, SLURMD}
        if v.boolean("slurm_conf_check"):
            custom.add(conf_fact(v.string("slurm_conf_dir").rstrip("/")))
        return FactRequest(files=frozenset(self.paths(v).values()),
                           sysctls=frozenset({NR_OPEN}), custom=frozenset(custom))

    # ---- rendering -----------------------------------------------------------------------

    def limits_file(self, v: RoleVars) -> str:
        kib = self.memlock_kib(v)
        memlock = "unlimited" if kib is None else str(kib)
        nofile = str(self.nofile(v))
        rows = [(domain, kind, item, value) for domain in ("*", "root")
                for item, value in (("memlock", memlock), ("nofile", nofile))
                for kind in ("soft", "hard")]
        return render("slurm-limits.conf.j2", header=HEADER.format(role=self.name),
                      dropin=DROPIN, rows=rows)

    def dropin(self, v: RoleVars) -> str:
        kib = self.memlock_kib(v)
        return render("slurmd-limits.conf.j2", header=HEADER.format(role=self.name),
                      memlock="infinity" if kib is None else str(kib * 1024),
                      nofile=self.nofile(v))

    def gres_conf(self, gpus: list[dict[str, Any]], v: RoleVars) -> str:
        """gres.conf: AutoDetect=nvml, or one line per GPU type with its device files (GPU
        i of nvidia-smi is /dev/nvidia<i>). Raises VarError for a model that makes no type
        name."""
        header = HEADER.format(role=self.name)
        if v.boolean("slurm_gres_autodetect"):
            return render("gres.conf.j2", header=header, lines=["AutoDetect=nvml"],
                          source="Slurm's NVML plugin finds the GPUs, their types and files.")
        wanted = self.gres_type(v)
        by_type: dict[str | None, list[int]] = {}
        for gpu in gpus:
            kind = gpu_type(str(gpu.get("name"))) if wanted == "model" else wanted
            if kind is not None and not _TYPE.match(kind):
                raise VarError(f"host {v.host.name}: GPU model {gpu.get('name')!r} makes no "
                               "GRES type name; set slurm_gres_type to one")
            by_type.setdefault(kind, []).append(int(gpu["index"]))
        lines = [" ".join(["Name=gpu", *([f"Type={kind}"] if kind else []),
                           f"File=/dev/nvidia{index_range(indexes)}"])
                 for kind, indexes in by_type.items()]
        models = sorted({str(g.get("name")) for g in gpus})
        return render("gres.conf.j2", header=header, lines=lines,
                      source=f"{len(gpus)} GPU(s) ({', '.join(models)}), from nvidia-smi.")

    def cgroup_conf(self, v: RoleVars) -> str:
        return render("cgroup.conf.j2", header=HEADER.format(role=self.name),
                      settings=self.cgroup_settings(v))

    # ---- plan ----------------------------------------------------------------------------

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        changes: list[Change] = []
        reload = Run("systemctl daemon-reload", "systemctl daemon-reload")
        dropin = None
        too_high = self._nr_open(facts, v)
        if too_high is not None:
            changes.append(too_high)
        else:
            limits = file_change(self.name, facts, LIMITS_FILE, self.limits_file(v))
            changes += [limits] if limits else []
            if facts.get("systemd"):  # without systemd nothing reads a drop-in
                dropin = file_change(self.name, facts, DROPIN, self.dropin(v))
            if dropin is not None:
                dropin.steps.append(reload)
                changes.append(dropin)
        configs = self._configs(facts, v)
        changes += configs
        written = [c.resource.rsplit("/", 1)[-1] for c in configs  # gres.conf, cgroup.conf
                   if not any(isinstance(step, Fail) for step in c.steps)]
        changes += self._slurmd(facts, v, written, dropin is not None, reload)
        if v.boolean("slurm_conf_check"):
            changes += self._slurm_conf(facts, v)
        return changes

    def _nr_open(self, facts: Facts, v: RoleVars) -> Change | None:
        """A failing change when slurm_job_nofile exceeds the node's fs.nr_open: every
        login (pam_limits) and slurmd's start would fail to set it."""
        text = str(facts.get(f"sysctl:{NR_OPEN}") or "").strip()
        nofile = self.nofile(v)
        if not text.isdigit() or nofile <= int(text):
            return None
        return Change(self.name, f"file {LIMITS_FILE}", "verify", f"fs.nr_open {text}",
                      f"nofile {nofile}", [Fail(
                          f"slurm_job_nofile {nofile} exceeds this node's fs.nr_open {text}: "
                          "setting it would fail every login and slurmd's start; raise "
                          "fs.nr_open first or lower slurm_job_nofile")], kind="file")

    def _configs(self, facts: Facts, v: RoleVars) -> list[Change]:
        """gres.conf and cgroup.conf, where the inventory hands them to gpufleet."""
        changes: list[Change | None] = []
        paths = self.paths(v)
        if "slurm_gres_conf_manage" in paths:
            path = paths["slurm_gres_conf_manage"]
            content = self._gres(facts, v, path)
            changes.append(content if isinstance(content, Change) else
                           file_change(self.name, facts, path, content))
        if "slurm_cgroup_conf_manage" in paths:
            changes.append(file_change(self.name, facts, paths["slurm_cgroup_conf_manage"],
                                       self.cgroup_conf(v)))
        return [c for c in changes if c is not None]

    def _gres(self, facts: Facts, v: RoleVars, path: str) -> str | Change:
        """gres.conf's content, or the failing change that says why it cannot be written."""
        if v.boolean("slurm_gres_autodetect"):
            return self.gres_conf([], v)
        gpus = facts.get("gpus")
        expected = self.gpu_count(v)
        problem = None
        if gpus is None:
            problem = f"the node's GPUs are unknown ({facts.why_absent('gpus')})"
        elif not gpus:
            problem = "nvidia-smi lists no GPU"
        elif expected is not None and len(gpus) != expected:
            problem = f"nvidia-smi lists {len(gpus)} GPU(s), gpu_count is {expected}"
        if problem is not None:
            return Change(self.name, f"file {path}", "verify", problem,
                          "the node's GPUs" if expected is None else f"{expected} GPU(s)",
                          [Fail(f"gres.conf is not written: {problem}")], kind="file")
        try:
            return self.gres_conf(gpus, v)
        except VarError as exc:
            return Change(self.name, f"file {path}", "verify", "a GPU model with no type name",
                          "a GRES type", [Fail(str(exc))], kind="file")

    def _slurmd(self, facts: Facts, v: RoleVars, files: list[str], dropin: bool, reload: Run
                ) -> list[Change]:
        """Restarting slurmd when it runs with other limits than wanted, or must read a
        changed configuration file (``files``); where it is unknown, when its drop-in changes
        too; a manual change where no systemd unit restarts it."""
        slurmd: Slurmd | None = facts.get("slurmd")
        systemd = bool(facts.get("systemd"))
        if slurmd is not None and slurmd.pid == 0:
            return []  # not running: it reads everything when it starts
        kib = self.memlock_kib(v)
        memlock = "unlimited" if kib is None else str(kib * 1024)
        nofile = str(self.nofile(v))
        wanted = f"memlock {memory(memlock)}, nofile {nofile}"
        if slurmd is None:
            if not (files or dropin) or not systemd:
                return []
            before = f"unknown ({facts.why_absent('slurmd')})"
        else:
            limits_ok = slurmd.memlock == (memlock, memlock) and \
                slurmd.nofile == (nofile, nofile)
            parts = [] if limits_ok else [
                f"runs with memlock {limit_text(slurmd.memlock, memory)}, nofile "
                f"{limit_text(slurmd.nofile, str)}"]
            parts += [f"{', '.join(files)} changed"] if files else []
            if not parts:
                return []
            before = "; ".join(parts)
            if not systemd or slurmd.unit != "loaded":
                if limits_ok:
                    return []  # no unit to restart, and no way to tell it read the file
                return [Change(self.name, "service slurmd", MANUAL, before,
                               f"{wanted} (no systemd unit restarts it here: start slurmd "
                               "under these limits)", kind="service")]
        steps: list[Step] = [reload, Run("systemctl try-restart slurmd.service",
                                         "restart slurmd if it runs", timeout=300)]
        return [Change(self.name, "service slurmd", "restart", before, wanted, steps,
                       kind="service")]

    # ---- slurm.conf ----------------------------------------------------------------------

    def _slurm_conf(self, facts: Facts, v: RoleVars) -> list[Change]:
        directory = v.string("slurm_conf_dir").rstrip("/")
        name = f"slurm_conf:{directory}"
        conf: SlurmConf | None = facts.get(name)
        if conf is None:
            return [finding("slurm.conf", f"unknown ({facts.why_absent(name)})",
                            f"{directory}/slurm.conf read")]
        if not conf.exists:
            return [finding("slurm.conf", "absent", f"{conf.path} (configless Slurm: set "
                            "slurm_conf_dir to /run/slurm/conf, or slurm_conf_check false)")]
        return conf_findings(conf, v, facts.get("slurmd"))


def conf_findings(conf: SlurmConf, v: RoleVars, slurmd: Slurmd | None) -> list[Change]:
    """What slurm.conf lacks for training on this node, as manual changes."""
    found: list[Change] = []
    newest_only = slurmd is not None and slurmd.runs_older_than(24, 5)
    for key, wanted in (("Prolog", "slurm_prolog"), ("Epilog", "slurm_epilog")):
        if v.boolean(wanted):
            program = v.string(f"{wanted}_path")
            actual = runs(conf, key, program, newest_only)
            if actual is not None:
                found.append(finding(key, actual, f"{key}={program}"))
    if v.boolean("slurm_prolog"):
        flags = conf.last("PrologFlags")
        names = {f.strip().lower() for f in flags.value.split(",")} if flags else set()
        if not names & ALLOC_FLAGS:
            found.append(finding("PrologFlags", shown(flags), "PrologFlags=Alloc"))
        # A batch job whose prolog failed is requeued held (priority 0) unless told.
        scheduler = conf.last("SchedulerParameters")
        params = {p.strip().lower() for p in scheduler.value.split(",")} if scheduler else set()
        if "nohold_on_prolog_fail" not in params:
            found.append(finding("SchedulerParameters", shown(scheduler),
                                 "SchedulerParameters includes nohold_on_prolog_fail"))
    propagated = memlock_propagated(conf)
    if propagated is not None:
        found.append(finding("PropagateResourceLimits", propagated,
                             "PropagateResourceLimitsExcept=MEMLOCK"))
    plugins = conf.last("TaskPlugin")
    names = {p.strip().lower().removeprefix("task/") for p in plugins.value.split(",")} \
        if plugins else set()
    if "cgroup" not in names:
        found.append(finding("TaskPlugin", shown(plugins, conf),
                             "TaskPlugin=task/cgroup,task/affinity"))
    proctrack = conf.last("ProctrackType")  # unset: proctrack/cgroup, Slurm's Linux default
    if proctrack is not None and proctrack.value.lower() != "proctrack/cgroup":
        found.append(finding("ProctrackType", shown(proctrack),
                             "ProctrackType=proctrack/cgroup"))
    return found


def finding(key: str, actual: str, desired: str) -> Change:
    """A slurm.conf setting for an operator to make (gpufleet never writes slurm.conf)."""
    resource = key if key == "slurm.conf" else f"slurm.conf {key}"
    return Change(SlurmNodeRole.name, resource, MANUAL, actual, desired, kind="slurm.conf")


def shown(setting: Setting | None, conf: SlurmConf | None = None) -> str:
    """A setting as a finding shows it: ``Key value (file:line)``, or absent (and the
    includes that were not read, which may hold it)."""
    if setting is not None:
        return f"{setting.value} ({setting.where})"
    if conf is not None and conf.not_read:
        return "absent (not read: " + ", ".join(
            f"{name}: {why}" for name, why in conf.not_read.items()) + ")"
    return "absent"


def runs(conf: SlurmConf, key: str, program: str, newest_only: bool) -> str | None:
    """None when slurm.conf's ``key`` (Prolog, Epilog) runs ``program``, else what it has.
    Every line counts from Slurm 24.05 on; before, only the last one."""
    settings = conf.all(key)
    if not settings:
        return shown(None, conf)
    counted = settings[-1:] if newest_only else settings
    if any(matches(conf.resolve(s.value), program) for s in counted):
        return None
    listed = ", ".join(shown(s) for s in settings)
    if newest_only and len(settings) > 1:
        return f"{listed}: slurmd before 24.05 runs the last line only"
    return f"{listed}: does not run {program}"


def matches(pattern: str, path: str) -> bool:
    """Whether a Prolog/Epilog value (a path or a glob(7) pattern) names ``path``: a
    wildcard never matches a ``/``."""
    parts, names = pattern.split("/"), path.split("/")
    return len(parts) == len(names) and all(
        fnmatch.fnmatchcase(name, part) for part, name in zip(parts, names, strict=True))


def memlock_propagated(conf: SlurmConf) -> str | None:
    """None when slurm.conf keeps the submitting shell's memlock out of jobs, else how it
    lets it in."""
    only = conf.last("PropagateResourceLimits")
    excepted = conf.last("PropagateResourceLimitsExcept")

    def names(setting: Setting) -> set[str]:
        return {n.strip().upper() for n in setting.value.split(",") if n.strip()}

    if only is not None and excepted is not None:
        return (f"PropagateResourceLimits={only.value} ({only.where}) and "
                f"PropagateResourceLimitsExcept={excepted.value} ({excepted.where}): Slurm "
                "takes one of them only")
    if only is not None:
        if names(only) & {"ALL", "MEMLOCK"}:
            return f"PropagateResourceLimits={only.value} ({only.where}): memlock is propagated"
        return None
    if excepted is not None:
        if names(excepted) & {"ALL", "MEMLOCK"}:
            return None
        return (f"PropagateResourceLimitsExcept={excepted.value} ({excepted.where}): memlock "
                "is propagated")
    return "absent: every limit of the submitting shell is propagated, memlock too"


def gpu_type(model: str) -> str:
    """A GPU model as Slurm's NVML plugin names its type: lower case, blanks as
    underscores (``NVIDIA H200`` -> ``nvidia_h200``)."""
    return model.strip().lower().replace(" ", "_")


def index_range(indexes: list[int]) -> str:
    """``0`` or a range expression of device numbers: ``[0-7]``, ``[0-1,3]``."""
    ordered = sorted(set(indexes))
    if len(ordered) == 1:
        return str(ordered[0])
    runs_: list[str] = []
    start = prev = ordered[0]
    for index in [*ordered[1:], None]:
        if index is not None and index == prev + 1:
            prev = index
            continue
        runs_.append(str(start) if start == prev else f"{start}-{prev}")
        if index is not None:
            start = prev = index
    return f"[{','.join(runs_)}]"


def memory(value: str) -> str:
    """A memlock in bytes (or unlimited) in KiB, as limits.conf and the inventory count."""
    if value.isdigit() and int(value) % 1024 == 0:
        return f"{int(value) // 1024} KiB"
    return value if value == "unlimited" else f"{value} bytes"


def limit_text(pair: tuple[str, str] | None, show: Any) -> str:
    """A (soft, hard) limit: one value when both are the same."""
    if pair is None:
        return "unknown"
    soft, hard = (show(x) for x in pair)
    return soft if soft == hard else f"{soft} (hard {hard})"


ROLE = SlurmNodeRole()
