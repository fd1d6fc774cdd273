"""Inventories: the model every format reader fills (YAML, INI, ansible-inventory JSON),
host patterns, per-host templating and secrets. Imports nothing above it."""
