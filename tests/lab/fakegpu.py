"""A stand-in nvidia-smi on lab nodes that replays real output captured on a 2x H200 node
(tests/fixtures/h200x2), so GPU facts and checks run on GPU-less lab nodes. A node can be
made to hang (as nvidia-smi does on a GPU that fell off the bus), to list fewer GPUs in
its query than its topology shows, to have its last GPU of another model, or to report a
driver of another CUDA version. ``nvidia-smi -L`` is derived from the query capture (the
same GPUs, in -L's format). A query of other fields gets the capture's columns by name, and
the compute processes a test lists (``leave_process``). ``nvidia-smi nvlink -e`` replays the
capture with the error counts a test sets (``set_nvlink_errors``), and ``nvidia-smi -q -d
ECC,ROW_REMAPPER,PAGE_RETIREMENT`` answers the ``-q`` capture's header and those sections of
each GPU, with the values a test sets (``set_memory_errors``). The settings commands (``-pm``,
``-e``, ``-mig``, ``-c``, ``-pl``, ``-ac``/``-rac``, ``-lgc``/``-rgc``, ``-lmc``/``-rmc``)
change what the query reports on every GPU of the node, as a driver would (``-e`` only its
pending mode)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager

from gpufleet.facts.parsers import nvidia_smi
from gpufleet.lab.cluster import Lab
from tests.conftest import ROOT
from tests.lab.conftest import node_sh

CAPTURES = ROOT / "tests" / "fixtures" / "h200x2"
# Fields the query capture lacks, as the same node's ``nvidia-smi -q`` (nvidia_smi_q.txt)
# reports them; with --format=csv they carry their units.
EXTRA = {"compute_mode": "Default", "mig.mode.current": "Disabled", "memory.used": "0 MiB",
         "clocks.applications.graphics": "1980 MHz", "clocks.applications.memory": "3201 MHz",
         "vbios_version": "96.00.A5.00.1A",
         "mig.mode.pending": "Disabled", "ecc.mode.pending": "Enabled",
         "power.default_limit": "700.00 W", "clocks.default_applications.graphics": "1980 MHz",
         "clocks.default_applications.memory": "3201 MHz",
         "clocks_event_reasons.applications_clocks_setting": "Not Active"}
REPLAYED = {"query": "query_gpu_csv.txt", "topo": "topo_m.txt", "nvlink": "nvlink_status.txt",
            "q": "nvidia_smi_q.txt", "nvlink-e": "nvlink_e.txt"}
MEMORY_SECTIONS = ("ECC Mode", "ECC Errors", "Retired Pages", "Remapped Rows")
MEMORY_ARGS = "-q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT"
STATE = "/etc/gpufleet-lab/fake-gpu"
# The node's own python3 answers queries: the columns a --query-gpu asks for, picked from
# the capture by name (a field the capture lacks comes from the "extra" file, as set by a
# test), and --query-compute-apps from the "apps" file (bus id, pid, MiB), each listed while
# its process lives, as on a GPU, and from "apps-stuck", always listed (a process of another
# PID namespace, which the node cannot signal).
SCRIPT = f"""#!/usr/bin/python3 -IS
# gpufleet lab stand-in for nvidia-smi: replays output captured on a real 2x H200 node.
import json, os, re, sys, time
d = "{STATE}"
args = sys.argv[1:]
ON = {{"0": "Disabled", "1": "Enabled", "DISABLED": "Disabled", "ENABLED": "Enabled"}}
MODES = {{"0": "Default", "DEFAULT": "Default", "1": "Exclusive_Process",
         "EXCLUSIVE_PROCESS": "Exclusive_Process", "2": "Prohibited", "PROHIBITED": "Prohibited"}}
HELD = "clocks_event_reasons.applications_clocks_setting"
def app_clocks(v):
    mem, gr = v.split(",")
    return {{"clocks.applications.memory": mem + " MHz",
            "clocks.applications.graphics": gr + " MHz"}}
SETTERS = {{
    "-pm": lambda v: {{"persistence_mode": ON[v.upper()]}},
    "-e": lambda v: {{"ecc.mode.pending": ON[v.upper()]}},
    "-mig": lambda v: {{"mig.mode.current": ON[v.upper()], "mig.mode.pending": ON[v.upper()]}},
    "-c": lambda v: {{"compute_mode": MODES[v.upper()]}},
    "-pl": lambda v: {{"power.limit": "%.2f W" % float(v)}},
    "-ac": app_clocks,
    "-rac": lambda v: app_clocks("3201,1980"),
    "-lgc": lambda v: {{HELD: "Active", "clocks.current.sm": v.split(",")[0] + " MHz"}},
    "-lmc": lambda v: {{HELD: "Active"}},
    "-rgc": lambda v: {{HELD: "Not Active", "clocks.current.sm": None}},
    "-rmc": lambda v: {{HELD: "Not Active"}},
}}
TAKES_VALUE = {{"-pm", "-e", "-mig", "-c", "-pl", "-ac", "-lgc", "-lmc"}}
if os.path.exists(d + "/hang"):
    time.sleep(3600)
def read(name):
    try:
        with open(d + "/" + name) as f:
            return f.read()
    except FileNotFoundError:
        return ""
def option(prefix):
    return next((a[len(prefix):] for a in args if a.startswith(prefix)), None)
fmt = (option("--format=") or "csv").split(",")
def emit(header, rows):
    if "noheader" not in fmt:
        print(", ".join(header))
    for row in rows:
        print(", ".join(row))
gpu_fields, app_fields = option("--query-gpu="), option("--query-compute-apps=")
# a subcommand's own flags are not settings (``nvlink -e`` reads the error counters)
setters = [a for a in args if a in SETTERS] if args[:1] and args[0].startswith("-") else []
if setters:
    extra = json.loads(read("extra") or "{{}}")
    flag = setters[0]
    value = args[args.index(flag) + 1] if flag in TAKES_VALUE else ""
    for key, new in SETTERS[flag](value).items():
        if new is None:
            extra.pop(key, None)
        else:
            extra[key] = new
    with open(d + "/extra", "w") as f:
        f.write(json.dumps(extra))
    print("All done.")
    sys.exit(0)
if gpu_fields:
    lines = read("query").splitlines()
    names = [re.sub(r" \\[.*\\]$", "", h.strip()) for h in lines[0].split(",")]
    extra = json.loads(read("extra") or "{{}}")
    alias = {{"clocks.sm": "clocks.current.sm", "clocks.gr": "clocks.current.graphics",
             "clocks.mem": "clocks.current.memory"}}
    wanted = [alias.get(f, f) for f in gpu_fields.split(",")]
    if wanted == names:
        sys.stdout.write(read("query"))
        sys.exit(0)
    for field in wanted:
        if field not in names and field not in extra:
            print(f'Field "{{field}}" is not a valid field to query.', file=sys.stderr)
            sys.exit(2)
    rows = []
    for line in lines[1:]:
        values = dict(zip(names, (v.strip() for v in line.split(","))))
        row = []
        for field in wanted:
            value = str(extra[field]) if field in extra else values.get(field, "")
            if "nounits" in fmt:
                value = re.sub(r" (MiB|W|MHz|%)$", "", value)
            row.append(value)
        rows.append(row)
    emit(wanted, rows)
elif app_fields:
    rows = []
    for name, live in (("apps", True), ("apps-stuck", False)):
        for line in read(name).splitlines():
            bus, pid, mib = (v.strip() for v in line.split(","))
            if not live or os.path.exists("/proc/" + pid):
                values = {{"gpu_bus_id": bus, "pid": pid, "used_memory": mib,
                          "process_name": "python3", "gpu_uuid": ""}}
                rows.append([values[f] for f in app_fields.split(",")])
    emit(app_fields.split(","), rows)
else:
    replayed = {{"topo -m": "topo", "nvlink --status": "nvlink", "-q": "q", "-L": "list",
                "nvlink -e": "nvlink-e", "{MEMORY_ARGS}": "q-memory"}}
    key = " ".join(args)
    if key not in replayed:
        print("lab nvidia-smi: arguments not replayed: " + key, file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(read(replayed[key]))
"""


def install(lab: Lab, node: str, *, hang: bool = False, drop_last_gpu: bool = False,
            last_gpu_model: str | None = None, driver_cuda: str | None = None) -> None:
    """Put the stand-in on ``node`` (its /usr/local/bin, in the node's own overlay)."""
    commands = [f"mkdir -p {STATE}",
                f"printf '%s' {shlex.quote(SCRIPT)} > /usr/local/bin/nvidia-smi",
                "chmod 755 /usr/local/bin/nvidia-smi"]
    for name, capture in REPLAYED.items():
        text = (CAPTURES / capture).read_text()
        if name == "query" and drop_last_gpu:
            text = "".join(text.splitlines(keepends=True)[:-1])
        if name == "query" and last_gpu_model:
            *rest, last = text.splitlines(keepends=True)
            text = "".join([*rest, last.replace("NVIDIA H200", last_gpu_model, 1)])
        if name == "q" and driver_cuda:
            text = re.sub(r"^(CUDA Version\s*:) \S+", rf"\1 {driver_cuda}", text, count=1,
                          flags=re.MULTILINE)
        commands.append(f"printf '%s' {shlex.quote(text)} > {STATE}/{name}")
    listing = "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n"
                      for g in nvidia_smi.nvidia_smi_query((CAPTURES / REPLAYED["query"])
                                                        .read_text()))
    commands.append(f"printf '%s' {shlex.quote(listing)} > {STATE}/list")
    commands.append(f"printf '%s' {shlex.quote(memory_errors({}))} > {STATE}/q-memory")
    commands.append(f"printf '%s' {shlex.quote(json.dumps(EXTRA))} > {STATE}/extra")
    if hang:
        commands.append(f": > {STATE}/hang")
    node_sh(lab, node, " && ".join(commands))


def set_fields(lab: Lab, node: str, **fields: str) -> None:
    """Give every stand-in GPU of ``node`` these query fields (dots written as ``__``:
    ``compute_mode="Exclusive_Process"``)."""
    extra = {**EXTRA, **{k.replace("__", "."): v for k, v in fields.items()}}
    node_sh(lab, node, f"printf '%s' {shlex.quote(json.dumps(extra))} > {STATE}/extra")


def nvlink_errors(counts: dict[tuple[int, int, str], int]) -> str:
    """``nvidia-smi nvlink -e`` as captured, with ``counts`` ((GPU, link, counter as
    printed: ``Replay Errors``) -> value) in place of the capture's."""
    lines, gpu = [], -1
    for line in (CAPTURES / REPLAYED["nvlink-e"]).read_text().splitlines(keepends=True):
        head = re.match(r"GPU (\d+):", line)
        gpu = int(head.group(1)) if head else gpu
        link = re.match(r"^(\s*Link (\d+): )(.+?): (\d+)$", line.rstrip("\n"))
        key = (gpu, int(link.group(2)), link.group(3)) if link else None
        lines.append(f"{link.group(1)}{link.group(3)}: {counts[key]}\n"
                     if link and key in counts else line)
    return "".join(lines)


def set_nvlink_errors(lab: Lab, node: str, counts: dict[tuple[int, int, str], int]) -> None:
    """``nvidia-smi nvlink -e`` on ``node`` reports ``counts`` (see ``nvlink_errors``)."""
    node_sh(lab, node, f"printf '%s' {shlex.quote(nvlink_errors(counts))} > "
                       f"{STATE}/nvlink-e")


def clear_errors_command() -> str:
    """The shell command that gives a node's stand-in no NVLink and memory errors but the
    capture's."""
    return (f"printf '%s' {shlex.quote(nvlink_errors({}))} > {STATE}/nvlink-e && "
            f"printf '%s' {shlex.quote(memory_errors({}))} > {STATE}/q-memory")


def memory_errors(values: dict[tuple[str, str], str]) -> str:
    """``nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT``: the ``-q`` capture's header
    and, for each GPU, its MEMORY_SECTIONS, with ``values`` ((GPU line's bus id, path of
    the field: ``ECC Errors/Aggregate/DRAM Correctable``) -> value) in place of the
    capture's."""
    out: list[str] = []
    gpu, keep = "", True
    stack: list[tuple[int, str]] = []
    for line in (CAPTURES / REPLAYED["q"]).read_text().splitlines():
        if line.startswith("GPU "):
            gpu, keep, stack = line[4:].strip(), True, []
            out += ["", line] if out[-1] else [line]
            continue
        if not gpu:
            out.append(line)
            continue
        indent = len(line) - len(line.lstrip())
        name, colon, _ = line.strip().partition(":")
        if indent == 4:
            keep = name.strip() in MEMORY_SECTIONS
        if not keep or not line.strip():
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([*(n for _, n in stack), name.strip()])
        if not colon:
            stack.append((indent, name.strip()))
        out.append(f"{line.split(':', 1)[0]}: {values[(gpu, path)]}"
                   if colon and (gpu, path) in values else line)
    return "\n".join(out) + "\n\n"


def set_memory_errors(lab: Lab, node: str, values: dict[tuple[str, str], str]) -> None:
    """``nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT`` on ``node`` reports ``values``
    (see ``memory_errors``)."""
    node_sh(lab, node, f"printf '%s' {shlex.quote(memory_errors(values))} > "
                       f"{STATE}/q-memory")


def list_process(lab: Lab, node: str, bus_id: str, pid: int, mib: int, *,
                 stuck: bool = False) -> None:
    """List ``pid`` as a compute process on the stand-in GPU ``bus_id`` while it lives, or
    always (``stuck``: a process the node cannot signal, of another PID namespace)."""
    name = "apps-stuck" if stuck else "apps"
    node_sh(lab, node, f"echo {shlex.quote(f'{bus_id}, {pid}, {mib}')} >> {STATE}/{name}")


def remove(lab: Lab, node: str) -> None:
    node_sh(lab, node, f"rm -rf {STATE} /usr/local/bin/nvidia-smi")


@contextmanager
def fake_gpus(lab: Lab, nodes: list[str], hang: frozenset[str] = frozenset()
              ) -> Iterator[None]:
    """The stand-in on every node of ``nodes`` (hanging on those in ``hang``), removed
    afterwards."""
    try:
        for node in nodes:
            install(lab, node, hang=node in hang)
        yield
    finally:
        for node in nodes:
            remove(lab, node)
