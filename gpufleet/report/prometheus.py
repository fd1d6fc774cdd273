"""Prometheus node_exporter textfiles, built and written by prometheus_client.

Every series carries the ``inventory`` label (:func:`inventory_label`), so the textfiles
of two inventories can share one node_exporter textfile directory without colliding, and
every file carries ``gpufleet_build_info{command,version}`` (the command keeps a drift and a
conformance file of one inventory apart). A run over a subset of the hosts
(``--limit``) keeps the series of the other hosts from the file it replaces
(:meth:`Textfile.keep_others`), read again under a lock when it writes (:func:`update`), so
a limited run updates only its own hosts, however many run at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet import __version__
from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host, Inventory
from gpufleet.report.outputs import local_put

METRICS_NAME_VAR = "gpufleet_metrics_name"
LOCK_SUFFIX = ".lock"
LOCK_TIMEOUT_S = 60.0  # another run holds the lock only to read, merge and write one file
_SAMPLE_SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum")


class MetricsError(GpufleetError):
    """The textfile cannot be written as asked (another inventory's file, mixed names)."""


def inventory_label(inventory: Inventory, hosts: Sequence[Host]) -> str:
    """The ``inventory`` label: the hosts' ``gpufleet_metrics_name``, else the inventory's
    name (its directory, or its file without the extension)."""
    names = {str(h.vars[METRICS_NAME_VAR]) for h in hosts if h.vars.get(METRICS_NAME_VAR)}
    if len(names) > 1:
        raise MetricsError(f"variable {METRICS_NAME_VAR} differs between the hosts of this "
                           f"run ({', '.join(sorted(names))}): one run writes one inventory's "
                           "metrics")
    if names:
        return names.pop()
    path = inventory.path
    return path.name if path.is_dir() else path.stem


class Textfile:
    """The metric families of one textfile, every series labelled with the inventory."""

    def __init__(self, inventory: str, command: str) -> None:
        self.inventory = inventory
        self.registry = CollectorRegistry(auto_describe=True)
        self._gauges: dict[str, Gauge] = {}
        self._labels: dict[str, tuple[str, ...]] = {}
        self.gauge("gpufleet_build_info", "The gpufleet version and command that wrote this "
                   "file (always 1).", ["command", "version"])
        self.set("gpufleet_build_info", 1, command=command, version=__version__)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        """A gauge family; its first label is always ``inventory``."""
        names = ("inventory", *labels)
        self._gauges[name] = Gauge(name, documentation, names, registry=self.registry)
        self._labels[name] = names
        return self._gauges[name]

    def set(self, name: str, value: float, **labels: str) -> None:
        """One sample of a family made by :meth:`gauge`."""
        self._gauges[name].labels(inventory=self.inventory, **labels).set(value)

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """The samples of one family so far (labels without ``inventory``, value)."""
        found = []
        for family in self.registry.collect():
            if family.name == name:
                for sample in family.samples:
                    labels = {k: v for k, v in sample.labels.items() if k != "inventory"}
                    found.append((labels, float(sample.value)))
        return found

    def keep_others(self, previous: str, hosts: Iterable[str]) -> None:
        """Add the samples of ``previous`` (the file this one replaces, see
        :func:`replaced`) of the hosts not in ``hosts``, for every family this file has
        with a ``host`` label."""
        run = set(hosts)
        for family in text_string_to_metric_families(previous):
            first = family.samples[0].labels if family.samples else {}
            if (family.name not in self._labels and family.type == "gauge"
                    and "host" in first and "inventory" in first):
                # a family none of this run's hosts has now: the others' series stay
                self.gauge(family.name, family.documentation,
                           [k for k in first if k != "inventory"])
            for sample in family.samples:
                name, labels = _family_name(sample.name), dict(sample.labels)
                names = self._labels.get(name)
                if (names is None or "host" not in names or labels.get("host") in run
                        or set(labels) != set(names) or math.isnan(sample.value)):
                    continue
                labels.pop("inventory")
                self.set(name, sample.value, **labels)

    def text(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)


def _family_name(sample: str) -> str:
    for suffix in _SAMPLE_SUFFIXES:
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


def replaced(path: str, inventory: str, command_name: str) -> str | None:
    """The textfile at ``path`` that this run's will replace (None: there is none, or
    ``-``), checked before the run: a file of another inventory, or one holding metrics
    gpufleet did not write, is refused rather than overwritten."""
    if path == "-":
        return None
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise MetricsError(f"--prometheus {path}: cannot read the file it would replace: "
                           f"{exc}") from None
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise MetricsError(f"--prometheus {path}: not a Prometheus textfile ({exc}); gpufleet "
                           "does not overwrite it") from None
    foreign = sorted({f.name for f in families if not f.name.startswith("gpufleet_")})
    if foreign:
        raise MetricsError(f"--prometheus {path}: it holds metrics gpufleet did not write "
                           f"({', '.join(foreign[:3])}); give gpufleet a file of its own")
    owners = {(s.labels.get("inventory"), s.labels.get("command")) for f in families
              if f.name == "gpufleet_build_info" for s in f.samples}
    others = sorted(f"{command or 'gpufleet'} of inventory {name}" for name, command in owners
                    if (name, command) != (inventory, command_name)
                    and not (name == inventory and command is None))
    if others:
        raise MetricsError(f"--prometheus {path}: it holds the metrics of {others[0]}, not "
                           f"{command_name} of inventory {inventory}: give each inventory "
                           "and command a file of its own")
    return text


def write(path: str | Path, textfile: Textfile) -> None:
    """Write the textfile atomically (``-``: stdout): node_exporter never reads half a file,
    and the temporary name does not end in .prom, so its collector passes it over."""
    local_put(str(path), textfile.text())


def update(path: str, inventory: str, command_name: str, limited: bool,
           build: Callable[[str | None], Textfile]) -> None:
    """Write the run's textfile, ``build(previous)``, where ``previous`` is the file as it is
    now when the run covers part of the fleet (``limited``): read, merged and replaced under
    an exclusive lock on ``PATH.lock``, so two overlapping ``--limit`` runs each keep the
    other's series instead of writing back the copy they read when they started."""
    if path == "-":
        write(path, build(None))
        return
    with _locked(Path(path + LOCK_SUFFIX)):
        previous = replaced(path, inventory, command_name) if limited else None
        write(path, build(previous))


@contextlib.contextmanager
def _locked(lock: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """An exclusive ``flock`` on ``lock`` (created beside the textfile; its name does not
    end in .prom, so the collector passes it over), waited for up to ``timeout_s``; it is
    released when the process ends, however it ends."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise MetricsError(f"--prometheus: cannot open the lock file {lock}: "
                           f"{exc.strerror}") from None
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise MetricsError(f"--prometheus: {lock} stayed locked for {timeout_s:g} "
                                       "s by another gpufleet run") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


_NAME = re.compile(r"[^a-zA-Z0-9_]+")


def metric_name(*parts: str) -> str:
    """``gpufleet_`` and the parts, made a valid metric name (``a.b-c`` -> ``a_b_c``)."""
    return "_".join(["gpufleet", *(_NAME.sub("_", p).strip("_").lower() for p in parts if p)])
