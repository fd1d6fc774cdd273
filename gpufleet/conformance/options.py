"""What a conformance run is asked for, as one typed value: the command builds it once from
its flags (bootstrap and the plugin run directly from theirs), the runner acts on it, and
the session hands the very same value to the suites."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from gpufleet.conformance.baseline import BaselineStore
from gpufleet.conformance.registry import Suite
from gpufleet.connect.fleet import FleetOptions

Selection = Callable[[Suite, str], bool]


@dataclass(frozen=True)
class ConformanceOptions:
    """What a conformance run checks and how.

    ``image`` certifies that training image on every selected node (``container_image``
    for the run); ``source`` is the inventory as named (``slurm:gpu`` gives the launcher
    its partition); ``only(suite, check)`` keeps a check (all when None); ``console``
    receives pytest's progress and the summary; ``pytest_args`` are passed on to pytest as
    they are. ``baseline`` is the run's baseline store, when it records or compares.
    """

    suites: tuple[str, ...] = ("conformance",)
    pairs: str = "auto"
    with_nccl_tests: bool = False
    record_baseline: bool = False
    compare_baseline: bool = False
    launcher: str = "ssh"
    partition: str | None = None
    image: str | None = None
    source: str | None = None
    fleet: FleetOptions = field(default_factory=FleetOptions)
    artifacts: Path = Path("reports/conformance-artifacts")
    only: Selection | None = None
    console: TextIO | None = None
    pytest_args: tuple[str, ...] = ()
    baseline: BaselineStore | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        store = (BaselineStore(record=self.record_baseline, compare=self.compare_baseline)
                 if self.record_baseline or self.compare_baseline else None)
        object.__setattr__(self, "baseline", store)
