"""gpufleet-healthcheck: the node-local program in ``program.py``, shipped to nodes as one
file by the slurm_healthcheck role (it needs only Python's standard library there)."""
