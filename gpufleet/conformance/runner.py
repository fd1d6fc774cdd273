"""The conformance runner: ``run_suites`` takes a loaded target and typed options, checks
every variable the run reads, gathers the nodes' facts once, runs the selected suites'
checks through the pytest plugin and returns a typed :class:`ConformanceReport`. It is the
only caller of ``pytest.main``; the conformance command, bootstrap and the drains read
its report, never a file.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gpufleet import roles as role_registry
from gpufleet.conformance import container, registry
from gpufleet.conformance.options import ConformanceOptions, Selection
from gpufleet.conformance.registry import Suite
from gpufleet.conformance.results import ConformanceReport
from gpufleet.errors import GpufleetError
from gpufleet.inventory.target import Target
from gpufleet.provision.engine import validate
from gpufleet.slurm import inventory as slurm_inventory

if TYPE_CHECKING:
    from gpufleet.conformance.plugin import Supplied

LAUNCHERS = ("ssh", "slurm", "slurm-per-node")
AUTOLOAD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"
PAIRS = ("auto", "all", "ring")


class RunIncomplete(GpufleetError):
    """pytest stopped before every selected check had an outcome."""

    exit_code = 70


def check_options(target: Target, options: ConformanceOptions) -> list[Suite]:
    """Everything the run reads, checked before any host is contacted: the image (which
    becomes every selected host's ``container_image``), suites, pairs, launcher, and every
    role and suite variable of every selected host."""
    if options.image is not None:
        container.check_reference(options.image, "--image")
        for host in target.hosts:
            host.vars["container_image"] = options.image
    suites = registry.select(options.suites)
    if options.launcher not in LAUNCHERS:
        raise GpufleetError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got "
                            f"{options.launcher!r}")
    if options.pairs not in PAIRS and not _sample(options.pairs):
        raise GpufleetError(f"--pairs must be auto, all, ring or sample:K, got "
                            f"{options.pairs!r}")
    image = registry.suite("image")
    if image not in suites and any(h.vars.get("container_image") for h in target.hosts):
        suites.insert(0, image)  # a training image is certified wherever it is named
    validate(target.hosts, role_registry.ALL)
    registry.validate(target.hosts, suites)
    return suites


def _sample(pairs: str) -> bool:
    kind, _, count = pairs.partition(":")
    return kind == "sample" and count.isdigit() and int(count) > 0


def _keep(suites: Sequence[Suite], only: Selection | None) -> Callable[[str, str], bool]:
    by_name = {s.name: s for s in suites}

    def keep(suite: str, check: str) -> bool:
        entry = by_name.get(suite)
        return entry is None or only is None or only(entry, check)

    return keep


def _partition(options: ConformanceOptions) -> str | None:
    if options.partition:
        return options.partition
    source = options.source or ""
    return slurm_inventory.parse_source(source)[0] if slurm_inventory.is_slurm_source(
        source) else None


def run_suites(target: Target, options: ConformanceOptions) -> ConformanceReport:
    """Run the selected suites on the target's hosts; every node ends with a result for
    every check it was selected for (an unreachable node fails each)."""
    suites = check_options(target, options)
    # pytest, testinfra and the suites' machinery load only when suites run, so that drift,
    # provision and facts start without them.
    import pytest  # noqa: PLC0415

    from gpufleet.conformance.launch import cleanup_active  # noqa: PLC0415
    from gpufleet.conformance.plugin import (  # noqa: PLC0415
        RunState,
        Supplied,
        describe_allocation,
        open_allocation,
        report_of,
    )
    from gpufleet.conformance.session import ConformanceSession  # noqa: PLC0415

    fleet = options.fleet
    allocation = None
    if options.launcher != "ssh":
        try:
            allocation = open_allocation(target.hosts, fleet, _partition(options),
                                         combine=options.launcher == "slurm")
        except GpufleetError as exc:
            raise GpufleetError(f"--launcher {options.launcher}: {exc}") from None
    session: ConformanceSession | None = None
    try:
        session = ConformanceSession.start(target.inventory, target.hosts, options, suites)
        if allocation is not None:
            describe_allocation(session, allocation)
        state = RunState(session, only=_keep(suites, options.only), allocation=allocation)
        supplied = Supplied(state)
        code = _pytest(suites, options, supplied)
        if supplied.uncollected:  # pytest calls this "interrupted" too
            raise RunIncomplete(f"the conformance suites could not be collected: "
                                f"{'; '.join(supplied.uncollected)}")
        if code == pytest.ExitCode.INTERRUPTED:  # Ctrl-C or SIGTERM inside the checks
            raise KeyboardInterrupt
        if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            raise RunIncomplete(f"the conformance run could not complete (pytest exit "
                                f"{int(code)})")
        return report_of(state, True)
    finally:
        cleanup_active()
        if session is not None:
            session.close()
        if allocation is not None:
            allocation.release()


def _pytest(suites: Sequence[Suite], options: ConformanceOptions, supplied: Supplied) -> int:
    # Only gpufleet's plugin runs (no plugin pytest would load from whatever else is
    # installed, testinfra's included: nodes bring a testinfra host over gpufleet's own
    # connection); it goes in as the module object it is.
    # No configuration file either: a pytest.ini or pyproject.toml above the suites or in
    # the working directory is not gpufleet's.
    import pytest  # noqa: PLC0415

    from gpufleet.conformance import plugin  # noqa: PLC0415

    args = [*(str(s.path()) for s in suites), "-c", os.devnull, "-p", "no:cacheprovider",
            "--rootdir", str(registry.suites_dir()), "-q", "--tb=no", "--no-header", "-rN"]
    console = options.console or sys.stdout
    autoload = os.environ.get(AUTOLOAD)
    os.environ[AUTOLOAD] = "1"
    try:
        with contextlib.redirect_stdout(console):
            return int(pytest.main([*args, *options.pytest_args],
                                   plugins=[plugin, supplied]))
    finally:
        if autoload is None:
            os.environ.pop(AUTOLOAD, None)
        else:
            os.environ[AUTOLOAD] = autoload
