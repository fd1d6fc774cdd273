"""Slurm from the controller: the scontrol client, drain and resume, the srun launcher and
inventories built from a partition."""
