"""Provisioning: facts + variables -> a plan of changes per host (the engine), the role
contract, and the steps that apply a plan (apt, managed files, reboots)."""
