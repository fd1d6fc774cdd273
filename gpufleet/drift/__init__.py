"""Drift: the provisioning plan computed in check mode and reported, fleet consistency,
the history of runs and the nightly schedule. Never writes on a node."""
