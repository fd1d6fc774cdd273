"""Opt-in reboots, waiting for the host to come back with a new boot id.

Hosts reboot in parallel within a batch (``--serial`` bounds how many at once); the wait
is bounded by the reboot timeout and by what is left of the host's budget, and a host cut
off at its deadline is never rebooted or reconnected.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from gpufleet.connect.connection import Connection, HostCancelled, Unreachable
from gpufleet.errors import GpufleetError
from gpufleet.provision.plan import ApplyContext

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


@dataclass(eq=False)
class Reboot:
    """Reboot the host so that what only a boot loads is loaded: the installed driver's
    kernel module, the pinned kernel.

    Without ``--reboot`` the step only records that a reboot is pending (every reason, when
    several roles need one); the host is then reported as "reboot required", never as
    converged. One run reboots a host once: a second role's reboot after the first is done.
    """

    command: str
    reason: str

    def describe(self) -> str:
        return f"reboot ({self.reason})"

    def apply(self, ctx: ApplyContext) -> None:
        if not ctx.options.reboot:
            earlier = ctx.memo.get("reboot_pending")
            ctx.memo["reboot_pending"] = f"{earlier}; {self.reason}" if earlier else self.reason
            return
        if ctx.memo.get("rebooted"):
            ctx.log.append(f"reboot ({self.reason}): done by this run's reboot")
            return
        before = ctx.conn.run(BOOT_ID, timeout=30).check("reading boot id").stdout.strip()
        with contextlib.suppress(Unreachable):
            ctx.conn.run(f"({self.command}) >/dev/null 2>&1 &", timeout=30)
        ctx.conn.close()
        ctx.conn = wait_for_new_boot(ctx, before)
        ctx.memo["rebooted"] = True
        ctx.log.append(f"rebooted ({self.reason})")


def wait_for_new_boot(ctx: ApplyContext, old_boot_id: str) -> Connection:
    """Reconnect until the host answers with a boot id other than ``old_boot_id``."""
    deadline = time.monotonic() + ctx.options.reboot_timeout_s
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        time.sleep(1.0)
        conn = ctx.reconnect()
        try:
            boot_id = conn.run(BOOT_ID, timeout=15).stdout.strip()
        except HostCancelled:
            conn.close()
            raise
        except GpufleetError as exc:
            last_error = str(exc)
            conn.close()
            continue
        if boot_id and boot_id != old_boot_id:
            return conn
        conn.close()
    raise GpufleetError(f"host did not come back within {ctx.options.reboot_timeout_s}s "
                        f"after reboot (last: {last_error})")
