"""Exit codes of every gpufleet command (documented in the README)."""

OK = 0
FAILED = 1          # a host failed (provision), drift found (drift), a check failed
USAGE = 2           # bad input: inventory, variables, options
UNREACHABLE = 3     # a host was unreachable or its facts could not be gathered
REBOOT_REQUIRED = 4  # provision converged everything but a reboot is pending
INTERNAL = 70        # an unexpected error inside gpufleet (EX_SOFTWARE); -vvv shows why
INTERRUPTED = 130    # stopped by Ctrl-C (SIGINT)
TERMINATED = 143     # stopped by SIGTERM (128 + 15), after cleaning up
BROKEN_PIPE = 141    # the reader of standard output went away (128 + SIGPIPE)
