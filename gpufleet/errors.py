"""Errors that gpufleet reports to users as one clear line, never as a traceback."""

from __future__ import annotations


class GpufleetError(Exception):
    """A user-facing error; the CLI prints its message and exits with ``exit_code``."""

    exit_code = 2


class InventoryError(GpufleetError):
    """The inventory cannot be loaded: the message names the file, line and problem."""


class ParseError(GpufleetError):
    """Command output could not be understood; the value is unknown, never assumed."""


class LabError(GpufleetError):
    """The local lab cluster cannot be brought up, inspected or torn down."""


class VarError(GpufleetError):
    """An inventory variable has the wrong type or an impossible value; the message names
    the host, the variable and where the inventory sets it."""
