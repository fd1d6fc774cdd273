"""Exit codes of every gpufleet command (documented in the README)."""

OK = 0
FAILED = 1          # a host failed (provision), drift found (drift), a check failed
USAGE = 2           # bad input: inventory, variables, options
UNREACHABLE = 3     # a host was unreachable or its facts could not be gathered
REBOOT_REQUIRED = 4  # provision converged everything but a reboot is pending
