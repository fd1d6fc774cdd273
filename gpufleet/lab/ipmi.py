"""IPMI BMCs for lab nodes: OpenIPMI's BMC simulator (``ipmi_sim``, Debian's openipmi) per
node on the controller's loopback, spoken to with the real ipmitool over RMCP+.

Each simulator has the sensors of a GPU server's BMC, compiled into its SDR repository
with OpenIPMI's ``sdrcomp``: inlet and exhaust temperatures, a fan, the chassis' power
consumption in Watts and four power supplies (presence, failure, input lost). A fault is a
command on the simulator's console: a PSU failure (asserted with an event, so the SEL gets
a new entry), a hot inlet, another power reading. The SEL clock is set to the controller's
at start, so entries carry real times.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpufleet.bmc.target import IPMI_PASSWORD_MAX
from gpufleet.errors import LabError

ADDRESS = "127.0.0.1"
INLET, EXHAUST, FAN, POWER, FIRST_PSU, PSUS = 1, 2, 3, 4, 10, 4
POWER_STEP_W = 50  # the power sensor's resolution (its SDR's m)
FAN_STEP_RPM = 100
START_TIMEOUT_S = 20.0
SETTLE_S = 0.5  # the console applies a command within this


def _threshold(number: int, name: str, kind: str, unit: str, *, m: int, entity: str) -> str:
    return f"""sdr type 1
\tsensor_owner_id\t0x20
\tsensor_owner_lun\t0
\tchannel_number\t0
\tsensor_number\t{number}
\tentity_id\t{entity}
\tentity_instance\t1
\tinit_scanning\ttrue
\tinit_events\ttrue
\tinit_sensor_type\ttrue
\tdefault_event_gen_on\ttrue
\tdefault_sensor_scan_on\ttrue
\tsensor_type\t{kind}
\tevent_reading_type_code\t1
\tanalog_data_format\tunsigned
\trate_unit\tnone
\tmodifier_unit\tnone
\tpercentage\tfalse
\tbase_unit\t{unit}
\tmodifier_unit_code\tunspecified
\tlinearization\tlinear
\tm\t{m}
\ttolerance\t0
\tb\t0
\taccuracy\t1
\taccuracy_exp\t0
\tsensor_direction\tinput
\tr_exp\t0
\tb_exp\t0
\tsensor_maximum\t255
\tsensor_minimum\t0
\tid_string\t"{name}"
endsdr
"""


def _power_supply(number: int, instance: int) -> str:
    states = "".join(f"\tassert_event{i}\ttrue\n\tdeassert_event{i}\ttrue\n"
                     f"\tevent{i}_state_ret\ttrue\n" for i in range(7))
    return f"""sdr type 2
\tsensor_owner_id\t0x20
\tsensor_owner_lun\t0
\tchannel_number\t0
\tsensor_number\t{number}
\tentity_id\tpower_supply
\tentity_instance\t{instance}
\tinit_scanning\ttrue
\tinit_events\ttrue
\tinit_sensor_type\ttrue
\tdefault_event_gen_on\ttrue
\tdefault_sensor_scan_on\ttrue
\tsensor_type\tPower_Supply
\tevent_reading_type_code\t0x6f
{states}\tid_string\t"PS{instance} Status"
endsdr
"""


def sdrs() -> str:
    """The SDR repository's source (sdrcomp's language)."""
    return (_threshold(INLET, "Inlet Temp", "Temperature", "degrees_C", m=1,
                       entity="system_board")
            + _threshold(EXHAUST, "Exhaust Temp", "Temperature", "degrees_C", m=1,
                         entity="system_board")
            + _threshold(FAN, "Fan1", "Fan", "RPM", m=FAN_STEP_RPM,
                         entity="fan_cooling_device")
            + _threshold(POWER, "Pwr Consumption", "Other_Units_Based_Sensor", "Watts",
                         m=POWER_STEP_W, entity="power_supply")
            + "".join(_power_supply(FIRST_PSU + i, i + 1) for i in range(PSUS)))


def emulation(power_w: int) -> str:
    """The simulator's start-up commands: the BMC, its SEL and every sensor's value."""
    lines = ["mc_setbmc 0x20",
             "mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr",
             "sel_enable 0x20 1000 0x0a",
             f"sensor_add 0x20 0 {INLET} 0x01 0x01", f"sensor_set_value 0x20 0 {INLET} 24 0",
             f"sensor_add 0x20 0 {EXHAUST} 0x01 0x01",
             f"sensor_set_value 0x20 0 {EXHAUST} 41 0",
             f"sensor_add 0x20 0 {FAN} 0x04 0x01",
             f"sensor_set_value 0x20 0 {FAN} {9000 // FAN_STEP_RPM} 0",
             f"sensor_add 0x20 0 {POWER} 0x0b 0x01",
             f"sensor_set_value 0x20 0 {POWER} {power_w // POWER_STEP_W} 0"]
    for i in range(PSUS):
        lines += [f"sensor_add 0x20 0 {FIRST_PSU + i} 0x08 0x6f",
                  f"sensor_set_bit_clr_rest 0x20 0 {FIRST_PSU + i} 0 1 0"]
    return "\n".join([*lines, "mc_enable 0x20", ""])


def lan_conf(name: str, port: int, user: str, password: str) -> str:
    return f"""name "{name}"
set_working_mc 0x20
  startlan 1
    addr {ADDRESS} {port}
    priv_limit admin
    allowed_auths_callback md5
    allowed_auths_user md5
    allowed_auths_operator md5
    allowed_auths_admin md5
    guid a123456789abcdefa123456789abcdef
  endlan
  user 2 true "{user}" "{password}" admin 10 md5
"""


@dataclass
class LabIpmiBmc:
    """One node's simulated BMC and its console."""

    node: str
    port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    def command(self, line: str) -> None:
        """A command on the simulator's console (ipmi_sim_cmd(5))."""
        assert self.process is not None and self.process.stdin is not None
        console: IO[bytes] = self.process.stdin
        console.write(line.encode() + b"\n")
        console.flush()
        time.sleep(SETTLE_S)

    def fail_psu(self, index: int, failed: bool = True) -> None:
        """PSU ``index`` reports a failure (logged in the SEL), or no longer does."""
        self.command(f"sensor_set_bit 0x20 0 {FIRST_PSU + index} 1 {int(failed)} 1")

    def set_inlet(self, celsius: int) -> None:
        self.command(f"sensor_set_value 0x20 0 {INLET} {celsius} 0")

    def set_power(self, watts: int) -> None:
        self.command(f"sensor_set_value 0x20 0 {POWER} {watts // POWER_STEP_W} 0")


@dataclass
class LabIpmiBmcs:
    bmcs: dict[str, LabIpmiBmc] = field(default_factory=dict)


def _ipmitool(bmc: LabIpmiBmc, user: str, password: str, *args: str
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ipmitool", "-I", "lanplus", "-C", "3", "-N", "1", "-R", "1",
                           "-H", ADDRESS, "-p", str(bmc.port), "-U", user, "-E", *args],
                          capture_output=True, text=True, timeout=30, check=False,
                          env={**os.environ, "IPMI_PASSWORD": password})


@contextlib.contextmanager
def running(directory: Path, nodes: dict[str, int], user: str, password: str,
            power_w: int = 5200) -> Iterator[LabIpmiBmcs]:
    """A simulated IPMI BMC for each node (node -> UDP port) while the context lasts."""
    if len(password.encode()) > IPMI_PASSWORD_MAX:
        raise LabError(f"an IPMI password is at most {IPMI_PASSWORD_MAX} bytes")
    found = LabIpmiBmcs()
    source = directory / "lab.sdrs"
    directory.mkdir(parents=True, exist_ok=True)
    source.write_text(sdrs())
    compiled = subprocess.run(["sdrcomp", str(source)], capture_output=True, check=False)
    if compiled.returncode != 0:
        raise LabError(f"sdrcomp: {compiled.stderr.decode().strip()[-300:]}")
    try:
        for node, port in nodes.items():
            bmc = LabIpmiBmc(node, port, directory / node)
            name = f"gf-{node}"
            shutil.rmtree(bmc.directory / "state", ignore_errors=True)  # a new SEL each time
            state = bmc.directory / "state" / "ipmi_sim" / name
            state.mkdir(parents=True)
            (state / "sdr.20.main").write_bytes(compiled.stdout)
            conf = bmc.directory / "lan.conf"
            conf.touch(mode=0o600)
            conf.write_text(lan_conf(name, port, user, password))
            (bmc.directory / "lab.emu").write_text(emulation(power_w))
            with (bmc.directory / "ipmi_sim.log").open("wb") as log:
                bmc.process = subprocess.Popen(
                    ["ipmi_sim", "-c", str(conf), "-f", str(bmc.directory / "lab.emu"),
                     "-s", str(bmc.directory / "state")],
                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
            found.bmcs[node] = bmc
        for bmc in found.bmcs.values():
            _wait(bmc, user, password)
        yield found
    finally:
        for bmc in found.bmcs.values():
            if bmc.process is not None:
                bmc.process.kill()
                bmc.process.wait(timeout=10)


def _wait(bmc: LabIpmiBmc, user: str, password: str) -> None:
    """Until the simulator answers over RMCP+; then its SEL clock is set to now."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert bmc.process is not None
        if bmc.process.poll() is not None:
            log = (bmc.directory / "ipmi_sim.log").read_text(errors="replace")
            raise LabError(f"the lab IPMI BMC of {bmc.node} exited: {log.strip()[-300:]}")
        if _ipmitool(bmc, user, password, "mc", "guid").returncode == 0:
            set_clock = _ipmitool(bmc, user, password, "sel", "time", "set", "now")
            if set_clock.returncode != 0:
                raise LabError(f"the lab IPMI BMC of {bmc.node}: sel time set now: "
                               f"{set_clock.stderr.strip()[-200:]}")
            return
        time.sleep(0.2)
    raise LabError(f"the lab IPMI BMC of {bmc.node} did not answer on {ADDRESS}:{bmc.port}")
