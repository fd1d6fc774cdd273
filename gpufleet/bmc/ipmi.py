"""Reading a node's BMC over IPMI (RMCP+, ``ipmitool -I lanplus``), from the controller.

Three reads, each one ipmitool command: ``sdr elist`` (every sensor: temperatures, fans,
power supplies' states, a power reading in Watts), ``sel elist`` (the system event log) and
``dcmi power reading`` (the chassis' power now and its maximum over the sampling period;
a BMC without DCMI answers the SDR's power sensor instead). pyghmi would speak IPMI from
Python, but ipmitool is what operators run against their BMCs, and its output is what the
parsers are held to.

The password is given to ipmitool in its environment (``-E``: ``IPMI_PASSWORD``), never on
its command line; every message passes through the inventory's redaction.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass

from gpufleet.bmc.target import BmcError, BmcTarget
from gpufleet.inventory.secrets import redact

COMMAND_TIMEOUT_S = 60.0
SESSION_TIMEOUT_S = 2  # ipmitool -N: seconds per try
RETRIES = 2  # ipmitool -R
_CAUSES = (("RAKP 2 HMAC is invalid", "the BMC refused the password of {user!r}"),
           ("unauthorized name", "the BMC does not know the user {user!r}"),
           ("Get Auth Capabilities error", "unreachable: no answer on {port}/udp"),
           ("invalid authentication algorithm",
            "the BMC does not offer cipher suite {suite} (bmc_ipmi_cipher_suite)"))


@dataclass
class IpmiOutput:
    """What ipmitool printed for each read."""

    sdr: str
    sel: str
    dcmi: str | None
    duration_s: float = 0.0


def base(target: BmcTarget) -> list[str]:
    """ipmitool's arguments for the target, the password left to its environment."""
    host, port = target.host_port
    return ["ipmitool", "-I", "lanplus", "-C", str(target.cipher_suite),
            "-N", str(SESSION_TIMEOUT_S), "-R", str(RETRIES), "-H", host, "-p", str(port),
            "-U", target.user, "-E"]


def run(target: BmcTarget, args: list[str], verbose: bool = False,
        timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """One ipmitool command; BmcError when ipmitool is missing or does not return within
    ``timeout_s``."""
    if shutil.which("ipmitool") is None:
        raise BmcError(f"{target.where}: ipmitool is not installed on the controller "
                       f"(apt-get install ipmitool)")
    argv = base(target)
    if verbose:
        argv.insert(1, "-v")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "IPMI_PASSWORD": target.password}
    try:
        return subprocess.run([*argv, *args], capture_output=True, text=True, env=env,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise BmcError(f"{target.where}: ipmitool {' '.join(args)} did not return within "
                       f"{timeout_s:g}s") from None


def _failure(target: BmcTarget, args: list[str], result: subprocess.CompletedProcess[str]
             ) -> BmcError:
    """Why a command failed: a session that could not be opened is asked again with -v,
    whose messages tell a refused password, an unknown user and no answer apart."""
    text = result.stderr + result.stdout
    if "Unable to establish" in text:
        text += run(target, ["mc", "guid"], verbose=True).stderr
        _, port = target.host_port
        for marker, words in _CAUSES:
            if marker in text:
                return BmcError(f"{target.where}: " + words.format(
                    user=target.user, port=port, suite=target.cipher_suite))
    last = [line for line in text.strip().splitlines() if line.strip()]
    detail = redact(last[-1][-300:]) if last else f"exit {result.returncode}"
    return BmcError(f"{target.where}: ipmitool {' '.join(args)} failed: {detail}")


def read(target: BmcTarget, budget_s: float = COMMAND_TIMEOUT_S * 3) -> IpmiOutput:
    """The SDR, the SEL and the DCMI power reading of one BMC, all three within
    ``budget_s`` seconds (``bmc_read_budget_s``)."""
    start = time.monotonic()
    outputs: dict[str, str | None] = {}
    for key, args in (("sdr", ["sdr", "elist"]), ("sel", ["sel", "elist"]),
                      ("dcmi", ["dcmi", "power", "reading"])):
        left = budget_s - (time.monotonic() - start)
        if left <= 0:
            raise BmcError(f"{target.where}: not read within bmc_read_budget_s "
                           f"({budget_s:g} s): stopped before ipmitool {' '.join(args)}")
        result = run(target, args, timeout_s=min(COMMAND_TIMEOUT_S, left))
        if result.returncode != 0:
            if key == "dcmi":
                outputs[key] = None
                continue
            raise _failure(target, args, result)
        outputs[key] = result.stdout
    return IpmiOutput(str(outputs["sdr"]), str(outputs["sel"]), outputs["dcmi"],
                      time.monotonic() - start)
