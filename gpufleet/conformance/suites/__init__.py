"""The suites' declarations: one module per suite, each exporting ``SUITE`` (a
:class:`gpufleet.conformance.registry.Suite`), which the registry discovers. Adding a suite
is adding a module here and its ``conformance/test_<name>.py``."""
