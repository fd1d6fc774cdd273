"""Verdict logic of the checks: pure functions from facts and measurements to problems,
one module per suite (``<suite>.py``, or ``<suite>_<topic>.py`` where a suite has several);
``nccl_log`` and ``mounts`` serve more than one suite."""
