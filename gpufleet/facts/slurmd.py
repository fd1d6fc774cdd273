"""What slurmd reads and runs with, as facts: slurm.conf with the files it includes, and the
running slurmd's unit, limits and version. Snippets for the facts round trip and pure
parsers of what they print.

slurm.conf is read as Slurm's own parser reads it (``src/common/parse_config.c``): keys are
case-insensitive, one ``Key=Value`` per line (a value in double quotes may hold blanks), an
unescaped ``#`` starts a comment, a line ending in an odd number of backslashes continues on
the next, ``\\x`` stands for ``x``, and a line that starts with ``Include`` (any case)
followed by blanks reads another file in its place, a relative name being taken from
slurm.conf's directory. Slurm does not expand globs in an ``Include``; ``%c`` stands for
the ClusterName, which the snippet does not resolve: such an include is reported as not
read.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
import shlex
from dataclasses import dataclass, field

from gpufleet.errors import ParseError
from gpufleet.facts.catalog import Fact

INCLUDE_DEPTH = 8
_KEY_VALUE = re.compile(r'^\s*([A-Za-z0-9_.]+)\s*[-*+/]?=\s*(?:"([^"]*)"|(\S+))(?:\s|$)')
_INCLUDE = re.compile(r"^include\s+(\S+)", re.IGNORECASE)
_NOT_FOLLOWED = re.compile(r"[%*?\[]")


@dataclass(frozen=True)
class Setting:
    """One ``Key=Value`` line: its value and where it is (file and line)."""

    value: str
    file: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class SlurmConf:
    """slurm.conf as slurmd reads it: every setting by lower-case key, in the order Slurm
    reads them (an include's settings at the include's place), and the includes that were
    not read (a glob, a ``%c``, a missing file), with why."""

    path: str
    exists: bool
    settings: dict[str, list[Setting]] = field(default_factory=dict)
    not_read: dict[str, str] = field(default_factory=dict)

    @property
    def directory(self) -> str:
        return self.path.rsplit("/", 1)[0] or "/"

    def all(self, key: str) -> list[Setting]:
        """Every line that sets ``key``, in reading order."""
        return self.settings.get(key.lower(), [])

    def last(self, key: str) -> Setting | None:
        """The line that decides a key set once (Slurm keeps the last of several)."""
        found = self.all(key)
        return found[-1] if found else None

    def resolve(self, name: str) -> str:
        """A path as Slurm takes it: a relative one from slurm.conf's directory."""
        return name if name.startswith("/") else f"{self.directory}/{name}"


def conf_lines(text: str) -> list[tuple[int, str]]:
    """slurm.conf's logical lines with the number of the line each starts on: comments cut,
    continued lines joined, escapes resolved, blank lines left out."""
    lines: list[tuple[int, str]] = []
    pending: str | None = None  # a line continued on the next
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        part = _strip_comment(raw)
        if pending is None:
            pending, start = "", number
        stripped = part.rstrip()
        if (len(stripped) - len(stripped.rstrip("\\"))) % 2:
            pending += stripped[:-1]
            continue
        lines.append((start, pending + part))
        pending = None
    if pending is not None:
        lines.append((start, pending))
    return [(n, logical) for n, line in lines
            if (logical := re.sub(r"\\(.)", r"\1", line).rstrip()).strip()]


def _strip_comment(line: str) -> str:
    slashes = 0
    for i, char in enumerate(line):
        if char == "#" and slashes % 2 == 0:
            return line[:i]
        slashes = slashes + 1 if char == "\\" else 0
    return line


def parse_conf(path: str, files: dict[str, str | None]) -> SlurmConf:
    """slurm.conf at ``path`` from the files' texts (``None``: the file is absent), its
    includes followed in place."""
    text = files.get(path)
    if text is None:
        return SlurmConf(path, False)
    conf = SlurmConf(path, True)
    _read(conf, path, files, depth=0, seen=set())
    return conf


def _read(conf: SlurmConf, path: str, files: dict[str, str | None], *, depth: int,
          seen: set[str]) -> None:
    seen.add(path)
    for number, line in conf_lines(files.get(path) or ""):
        include = _INCLUDE.match(line)
        if include:
            name = include.group(1)
            target = conf.resolve(name)
            if _NOT_FOLLOWED.search(name):
                conf.not_read[name] = "a glob or %c, which gpufleet does not expand"
            elif target in seen:
                conf.not_read[target] = "included again (a loop)"
            elif depth >= INCLUDE_DEPTH:
                conf.not_read[target] = f"included deeper than {INCLUDE_DEPTH} files"
            elif files.get(target) is None:
                conf.not_read[target] = "absent" if target in files else "not read"
            else:
                _read(conf, target, files, depth=depth + 1, seen=seen)
            continue
        match = _KEY_VALUE.match(line)
        if match:
            value = match.group(2) if match.group(2) is not None else match.group(3)
            conf.settings.setdefault(match.group(1).lower(), []).append(
                Setting(value, path, number))


def read_files(text: str) -> dict[str, str | None]:
    """The conf fact's output: ``@file PATH`` then the file in base64, or ``@missing PATH``,
    per file, in reading order."""
    files: dict[str, str | None] = {}
    current: str | None = None
    chunks: list[str] = []

    def close() -> None:
        if current is not None:
            try:
                files[current] = base64.b64decode("".join(chunks), validate=True).decode(
                    "utf-8", errors="replace")
            except (binascii.Error, ValueError) as exc:
                raise ParseError(f"bad base64 content for {current}: {exc}") from exc

    for line in text.splitlines():
        if line.startswith("@file "):
            close()
            current, chunks = line[len("@file "):], []
        elif line.startswith("@missing "):
            close()
            current = None
            files[line[len("@missing "):]] = None
        elif line.strip():
            if current is None:
                raise ParseError(f"slurm.conf fact: expected '@file PATH' or '@missing PATH', "
                                 f"got {line[:80]!r}")
            chunks.append(line.strip())
    close()
    if not files:
        raise ParseError("slurm.conf fact: no file was reported")
    return files


@functools.cache
def conf_fact(directory: str) -> Fact:
    """``slurm_conf:DIR``: DIR/slurm.conf and every file it includes (to a depth of
    :data:`INCLUDE_DEPTH`), parsed into a :class:`SlurmConf`. One Fact per directory."""
    d = shlex.quote(directory)
    root = f"{directory}/slurm.conf"
    include = r"s/^[Ii][Nn][Cc][Ll][Uu][Dd][Ee][[:space:]][[:space:]]*\([^[:space:]]*\).*/\1/p"
    shell = "\n".join([
        f"set -f; d={d}; seen=' '",
        "walk() {",
        "  case \"$seen\" in *\" $1 \"*) return 0;; esac",
        "  seen=\"$seen$1 \"",
        "  if [ ! -f \"$1\" ]; then echo \"@missing $1\"; return 0; fi",
        "  echo \"@file $1\"; base64 < \"$1\" || return 1",
        f"  [ \"$2\" -lt {INCLUDE_DEPTH} ] || return 0",
        f"  for i in $(sed -n {shlex.quote(include)} \"$1\"); do",
        "    case \"$i\" in *%*|*'*'*|*'?'*|*'['*) continue;; /*) ;; *) i=\"$d/$i\";; esac",
        "    walk \"$i\" $(($2 + 1)) || return 1",
        "  done",
        "}",
        f"walk {shlex.quote(root)} 0",
    ])
    return Fact(f"slurm_conf:{directory}", shell,
                lambda text: parse_conf(root, read_files(text)))


@dataclass(frozen=True)
class Slurmd:
    """The node's slurmd: its systemd unit's load state (None without systemd), the running
    daemon's process id (0: not running) and limits as /proc prints them (``unlimited`` or
    a number: bytes for memlock), and its version (None: no slurmd installed)."""

    unit: str | None
    pid: int
    memlock: tuple[str, str] | None
    nofile: tuple[str, str] | None
    version: str | None

    def runs_older_than(self, major: int, minor: int) -> bool:
        """Whether the installed slurmd is known to be older than ``major.minor``."""
        found = re.match(r"(\d+)\.(\d+)", self.version or "")
        if found is None:
            return False
        return (int(found[1]), int(found[2])) < (major, minor)


def slurmd_state(text: str) -> Slurmd:
    """What the slurmd snippet prints: ``LoadState=``/``MainPID=`` (systemd), ``pid=N``,
    /proc/PID/limits' memlock and open-files lines, ``version=slurm X.Y.Z``."""
    unit = None
    pid = 0
    limits: dict[str, tuple[str, str]] = {}
    version = None
    for line in text.splitlines():
        if line.startswith("LoadState="):
            unit = line.split("=", 1)[1].strip()
        elif line.startswith("pid="):
            value = line.split("=", 1)[1].strip()
            if not value.isdigit():
                raise ParseError(f"slurmd fact: expected pid=N, got {line[:80]!r}")
            pid = int(value)
        elif line.startswith(("Max locked memory ", "Max open files ")):
            fields = line.split()
            if len(fields) < 5:
                raise ParseError(f"slurmd fact: expected a /proc limits line, got {line!r}")
            limits["memlock" if fields[1] == "locked" else "nofile"] = (fields[3], fields[4])
        elif line.startswith("version="):
            version = line.split("=", 1)[1].split()[-1]
    return Slurmd(unit, pid, limits.get("memlock"), limits.get("nofile"), version)


SLURMD = Fact("slurmd", "\n".join([
    "pid=0",
    "if [ -d /run/systemd/system ]; then",
    "  unit=$(systemctl show slurmd.service -p LoadState -p MainPID 2>&1) ||"
    " { echo \"systemctl show slurmd.service: $unit\"; exit 1; }",
    "  echo \"$unit\"; pid=$(echo \"$unit\" | sed -n 's/^MainPID=//p')",
    "fi",
    "if [ \"${pid:-0}\" = 0 ]; then",
    "  for p in /proc/[0-9]*; do",
    "    read -r c 2>/dev/null < \"$p/comm\" || continue",
    "    [ \"$c\" = slurmd ] && { pid=${p#/proc/}; break; }",
    "  done",
    "fi",
    "echo \"pid=${pid:-0}\"",
    "[ \"${pid:-0}\" = 0 ] || grep -E '^Max (locked memory|open files) ' \"/proc/$pid/limits\"",
    "v=$(slurmd -V 2>/dev/null) && echo \"version=$v\"",
    "true",
]), slurmd_state, "systemctl")
"""The node's slurmd as systemd and /proc see it (``systemctl`` may hang: guarded)."""
