"""Conformance: the runner behind the conformance command, the pytest plugin and session,
probe launches, performance verdicts and baselines; checks/ holds the pure verdict logic."""
