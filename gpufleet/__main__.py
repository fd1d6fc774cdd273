"""``python -m gpufleet``: the gpufleet command (the nightly drift unit runs it this way)."""

from gpufleet.cli import main

main()
