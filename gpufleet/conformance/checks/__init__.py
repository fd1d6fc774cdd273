"""Verdict logic of the checks: pure functions from facts and measurements to problems."""
