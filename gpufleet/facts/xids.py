"""NVIDIA's Xid catalogue and the rules that judge Xid events in their context: the one
place the gpu suite, the Slurm health check role and (through its copy, held equal by
tests/unit/test_xid_catalogue.py) the node program learn what an Xid asks for.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, the Xids table (the
"Xids" sheet of its Xid-Catalog.xlsx) for Ampere and newer GPUs: codes 1 to 172, the newest
driver it names R575 (CUDA 12.9). The page prints no date; it was read on 2026-12-07.

Each Xid's "Resolution Bucket (Immediate Action)", NVIDIA's automatable first action, gives
it an action class, the class of the finding it makes:

  ignore       nothing to do (IGNORE; WORKFLOW_XID_45, a cleanup after another Xid or a
               killed application)
  application  restart the application, the node stays in service (RESTART_APP)
  reset        the GPU needs a reset: drain (RESET_GPU; WORKFLOW_XID_48, _NVLINK_ERR,
               _NVLINK5_ERR, whose fatal cases reset; CHECK_UVM; XID_154 whose text
               cannot be read)
  reboot       the node needs a reboot: drain (RESTART_BM; RESTART_VM, the node being the
               VM)
  hardware     a person must look: drain and hold (CONTACT_SUPPORT, CHECK_MECHANICALS,
               UPDATE_SWFW)

Xids 162 to 172 have no bucket in the catalogue, only text; their classes are gpufleet's
reading of it (docs/conformance.md, "Xid catalogue"). An Xid the catalogue does not list
is an application one.

Context changes the class (``judge``): Xid 154 takes the class of the recovery action its
text names; an NVLink Xid 144 to 150 the driver calls Nonfatal is an application one; and
an application Xid repeating on one GPU (``REPEATS`` bursts within ``REPEAT_WINDOW_S``, a
burst being the same Xid again within ``BURST_S`` of the one before) needs a reset, as
NVIDIA's WORKFLOW_XID_13 and _31 send repeats on one GPU to diagnostics.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SOURCE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
CLASSES = ("ignore", "application", "reset", "reboot", "hardware")  # mildest first
DRAINS = frozenset({"reset", "reboot", "hardware"})

# The immediate-action buckets the catalogue uses, and their classes.
RESOLUTIONS = {
    "IGNORE": "ignore", "WORKFLOW_XID_45": "ignore",
    "RESTART_APP": "application",
    "RESET_GPU": "reset", "WORKFLOW_XID_48": "reset", "WORKFLOW_NVLINK_ERR": "reset",
    "WORKFLOW_NVLINK5_ERR": "reset", "CHECK_UVM": "reset", "XID_154": "reset",
    "RESTART_BM": "reboot", "RESTART_VM": "reboot",
    "CONTACT_SUPPORT": "hardware", "CHECK_MECHANICALS": "hardware", "UPDATE_SWFW": "hardware",
}
NONE_GIVEN = "NONE_GIVEN"  # the resolution of an Xid the catalogue gives no bucket

# Codes the catalogue describes as "Unused" on every GPU it covers (deprecated, or Volta and
# older only), each with the immediate action CONTACT_SUPPORT.
UNUSED = (1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 26, 27,
          28, 29, 30, 33, 34, 35, 36, 42, 47, 49, 50, 51, 52, 53, 55, 56, 57, 58, 59, 61,
          65, 73, 81, 87, 90, 91, 111, 112, 113, 114, 115, 116, 117, 118, 122, 123, 124, 125,
          138)
UNUSED_NAME = "not used on Ampere or newer"

# code: (name, immediate action) of every other code. The name is the catalogue's
# description, shortened where it runs on; for 14 and 108, described as "Unused" though
# they apply, it comes from the trigger text and the mnemonic.
_ROWS: dict[int, tuple[str, str]] = {
    8: ("GPU stopped processing", "RESTART_APP"),
    11: ("Invalid or corrupted push buffer stream", "RESTART_APP"),
    13: ("Graphics Engine Exception", "RESTART_APP"),
    14: ("Fake or injected error", "IGNORE"),
    25: ("Invalid or illegal push buffer stream", "RESTART_APP"),
    31: ("GPU memory page fault", "RESTART_APP"),
    32: ("Invalid or corrupted push buffer stream", "RESTART_APP"),
    37: ("Driver firmware error", "IGNORE"),
    38: ("Driver firmware error", "IGNORE"),
    39: ("Copy Engine Exception", "RESTART_APP"),
    40: ("Copy Engine Exception", "RESTART_APP"),
    41: ("Copy Engine Exception", "RESTART_APP"),
    43: ("GPU stopped processing", "IGNORE"),
    44: ("Graphics Engine fault during context switch", "IGNORE"),
    45: ("Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45"),
    46: ("GPU stopped processing", "RESET_GPU"),
    48: ("Double Bit ECC Error", "WORKFLOW_XID_48"),
    54: ("Auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS"),
    60: ("Video processor exception", "RESTART_APP"),
    62: ("Internal micro-controller halt", "RESET_GPU"),
    63: ("GPU memory remapping event", "IGNORE"),
    64: ("GPU memory remapping failure", "RESET_GPU"),
    66: ("Illegal access by driver", "IGNORE"),
    67: ("Illegal access by driver", "IGNORE"),
    68: ("NVDEC0 Exception", "RESTART_APP"),
    69: ("Graphics Engine class error", "RESTART_APP"),
    70: ("CE3: Unknown Error", "RESTART_APP"),
    71: ("CE4: Unknown Error", "RESTART_APP"),
    72: ("CE5: Unknown Error", "RESTART_APP"),
    74: ("NVLINK Error", "WORKFLOW_NVLINK_ERR"),
    75: ("CE6: Unknown Error", "RESTART_APP"),
    76: ("CE7: Unknown Error", "RESTART_APP"),
    77: ("CE8: Unknown Error", "RESTART_APP"),
    78: ("vGPU Start Error", "UPDATE_SWFW"),
    79: ("GPU has fallen off the bus", "RESTART_BM"),
    80: ("Corrupted data sent to GPU", "RESTART_APP"),
    82: ("NVJPG0 Error", "RESTART_APP"),
    83: ("NVDEC1 Error", "RESTART_APP"),
    84: ("NVDEC2 Error", "RESTART_APP"),
    85: ("CE9: Unknown Error", "RESTART_APP"),
    86: ("OFA Exception", "RESTART_APP"),
    88: ("NVDEC3 Error", "RESTART_APP"),
    89: ("NVDEC4 Error", "RESTART_APP"),
    92: ("High single-bit ECC error rate", "IGNORE"),
    93: ("Non-fatal violation of provisioned InfoROM wear limit", "IGNORE"),
    94: ("Contained memory error", "RESTART_APP"),
    95: ("Uncontained memory error", "RESET_GPU"),
    96: ("NVDEC5 Error", "RESTART_APP"),
    97: ("NVDEC6 Error", "RESTART_APP"),
    98: ("NVDEC7 Error", "RESTART_APP"),
    99: ("NVJPG1 Error", "RESTART_APP"),
    100: ("NVJPG2 Error", "RESTART_APP"),
    101: ("NVJPG3 Error", "RESTART_APP"),
    102: ("NVJPG4 Error", "RESTART_APP"),
    103: ("NVJPG5 Error", "RESTART_APP"),
    104: ("NVJPG6 Error", "RESTART_APP"),
    105: ("NVJPG7 Error", "RESTART_APP"),
    106: ("SMBPBI Test Message", "IGNORE"),
    107: ("SMBPBI Test Message Silent", "IGNORE"),
    108: ("NVLink remote translation error", "IGNORE"),
    109: ("Context Switch Timeout Error", "RESET_GPU"),
    110: ("Security Fault Error", "RESET_GPU"),
    119: ("GSP RPC Timeout", "RESET_GPU"),
    120: ("GSP Error", "RESET_GPU"),
    121: ("C2C Error", "IGNORE"),
    126: ("CE10: Unknown Error", "RESTART_APP"),
    127: ("CE11: Unknown Error", "RESTART_APP"),
    128: ("CE12: Unknown Error", "RESTART_APP"),
    129: ("CE13: Unknown Error", "RESTART_APP"),
    130: ("CE14: Unknown Error", "RESTART_APP"),
    131: ("CE15: Unknown Error", "RESTART_APP"),
    132: ("CE16: Unknown Error", "RESTART_APP"),
    133: ("CE17: Unknown Error", "RESTART_APP"),
    134: ("CE18: Unknown Error", "RESTART_APP"),
    135: ("CE19: Unknown Error", "RESTART_APP"),
    136: ("Link Training Failed", "RESET_GPU"),
    137: ("NVLink Privilege Error", "IGNORE"),
    139: ("OFA1 Error", "RESTART_APP"),
    140: ("ECC Unrecovered Error", "RESET_GPU"),
    141: ("CUDA Fast Path Error", "IGNORE"),
    142: ("NVENC3 Error", "CONTACT_SUPPORT"),
    143: ("GPU Initialization Error", "RESET_GPU"),
    144: ("NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR"),
    145: ("NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR"),
    146: ("NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR"),
    147: ("NVLINK: TREX Error", "WORKFLOW_NVLINK5_ERR"),
    148: ("NVLINK: NVLPW_CTRL Error", "WORKFLOW_NVLINK5_ERR"),
    149: ("NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR"),
    150: ("NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR"),
    151: ("Key rotation Error", "RESTART_VM"),
    152: ("DLA SMMU Error", "IGNORE"),
    153: ("DLA timeout Error", "IGNORE"),
    154: ("GPU Recovery Action Changed", "XID_154"),
    155: ("NVLINK: SW Defined Error", "RESET_GPU"),
    156: ("Resource Retirement Event", "RESET_GPU"),
    157: ("Resource Retirement Failure", "IGNORE"),
    158: ("GPU Fatal Timeout", "RESET_GPU"),
    159: ("CHI Non-Data Error", "CHECK_UVM"),
    160: ("Channel Retirement Event", "IGNORE"),
    161: ("Channel Retirement Failure", "IGNORE"),
    162: ("Power smoothing circuitry reengaged", NONE_GIVEN),
    163: ("Power smoothing circuitry disengaged", NONE_GIVEN),
    164: ("Power smoothing circuitry low lifetime", NONE_GIVEN),
    165: ("Power smoothing circuitry lifetime exhausted", NONE_GIVEN),
    166: ("Confidential traffic before the link was set up for it", NONE_GIVEN),
    167: ("PCIe fatal timeout", NONE_GIVEN),
    168: ("Errors found in the write-protected region", NONE_GIVEN),
    169: ("Internal micro-controller halt", NONE_GIVEN),
    170: ("Interrupt seen in confidential computing mode", NONE_GIVEN),
    171: ("Uncorrectable DRAM error", NONE_GIVEN),
    172: ("Uncorrectable SRAM error", NONE_GIVEN),
}
# gpufleet's reading of the catalogue's text for the codes it gives no bucket: the power
# smoothing notices leave training as it is; the halts and fatal timeouts reset the GPU as
# their bucketed kin (62, 158) do; 171 and 172 detail an Xid 48; an error in the
# write-protected region needs the boot re-attempted.
_NONE_GIVEN = {162: "ignore", 163: "ignore", 164: "ignore", 165: "ignore", 166: "reset",
               167: "reset", 168: "reboot", 169: "reset", 170: "reset", 171: "reset",
               172: "reset"}


@dataclass(frozen=True)
class Xid:
    """One catalogue entry: its name, NVIDIA's immediate action and its action class."""

    name: str
    resolution: str
    action: str


CATALOGUE: dict[int, Xid] = {
    **{code: Xid(UNUSED_NAME, "CONTACT_SUPPORT", "hardware") for code in UNUSED},
    **{code: Xid(name, bucket, _NONE_GIVEN[code] if bucket == NONE_GIVEN else RESOLUTIONS[bucket])
       for code, (name, bucket) in _ROWS.items()},
}
UNKNOWN = Xid("not in NVIDIA's catalogue", "UNKNOWN", "application")

RECOVERY_XID = 154
NVLINK5_XIDS = range(144, 151)
REPEATS = 3
REPEAT_WINDOW_S = 3600.0
BURST_S = 10.0
_RECOVERY = re.compile(r"recovery action changed\b.*\bto\s+0x[0-9a-fA-F]+\s*\(([^)]*)\)",
                       re.IGNORECASE)
_NONFATAL = re.compile(r"^\S+\s+Nonfatal\b", re.IGNORECASE)


def xid(code: int) -> Xid:
    """The catalogue's entry for ``code`` (UNKNOWN when it lists none)."""
    return CATALOGUE.get(code, UNKNOWN)


def recovery_action(message: str) -> tuple[str, str] | None:
    """(class, action text) an Xid 154 message asks for: ``GPU recovery action changed from
    0x0 (None) to 0x2 (Node Reboot Required)`` asks for a reboot; a reset, an FLR or a
    drain ask for a reset; None for nothing. None when the message names no action."""
    match = _RECOVERY.search(message)
    if not match:
        return None
    text = match.group(1).strip()
    lower = text.lower()
    if "reboot" in lower:
        return "reboot", text
    if any(word in lower for word in ("reset", "flr", "drain")):
        return "reset", text
    if lower == "none":
        return "ignore", text
    return "reset", text


@dataclass(frozen=True)
class Verdict:
    """One Xid event judged: the event, its catalogue entry, the class it takes here, the
    resolution shown, and why the class differs from the catalogue's (empty when not)."""

    code: int
    pci: str
    message: str
    at: float | None
    xid: Xid
    action: str
    resolution: str
    why: str


def _alone(code: int, message: str) -> tuple[str, str, str]:
    """(class, resolution, why) of one event on its own."""
    entry = xid(code)
    if code == RECOVERY_XID and (asked := recovery_action(message)):
        return asked[0], asked[1], ""
    if code in NVLINK5_XIDS and _NONFATAL.match(message):
        return "application", entry.resolution, "Nonfatal"
    return entry.action, entry.resolution, ""


def burst_starts(times: Sequence[float]) -> list[float]:
    """The start of the burst each time (in order) belongs to: a time within ``BURST_S``
    of the one before joins its burst."""
    starts: list[float] = []
    for i, at in enumerate(times):
        starts.append(starts[-1] if i and at - times[i - 1] <= BURST_S else at)
    return starts


def repeats(starts: Sequence[float], start: float) -> int:
    """How many of the bursts (their sorted, distinct ``starts``) started within
    ``REPEAT_WINDOW_S`` up to and with ``start``."""
    return bisect.bisect_right(starts, start) - bisect.bisect_right(starts, start - REPEAT_WINDOW_S)


def judge(events: Sequence[Mapping[str, Any]]) -> list[Verdict]:
    """Each event (``xid``, ``pci``, ``message``, ``at``: the facts parser's) judged in the
    context of all of them, in their order. Events without a time never escalate."""
    alone = [_alone(int(e["xid"]), str(e.get("message", ""))) for e in events]
    timed: dict[tuple[str, int], list[float]] = {}
    for e, (action, _, _) in zip(events, alone, strict=True):
        if action == "application" and e.get("at") is not None:
            timed.setdefault((str(e["pci"]), int(e["xid"])), []).append(float(e["at"]))
    bursts = {key: dict(zip(sorted(times), burst_starts(sorted(times)), strict=True))
              for key, times in timed.items()}
    distinct = {key: sorted(set(starts.values())) for key, starts in bursts.items()}
    verdicts = []
    for e, first in zip(events, alone, strict=True):
        action, resolution, why = first
        code, pci, at = int(e["xid"]), str(e["pci"]), e.get("at")
        if action == "application" and at is not None:
            seen = repeats(distinct[(pci, code)], bursts[(pci, code)][float(at)])
            if seen >= REPEATS:
                action, why = "reset", f"{seen} times in {REPEAT_WINDOW_S / 3600:g} h on this GPU"
        verdicts.append(Verdict(code, pci, str(e.get("message", "")),
                                None if at is None else float(at), xid(code), action,
                                resolution, why))
    return verdicts


def describe(v: Verdict) -> str:
    """``Xid 79 on 0000:3b:00 (GPU has fallen off the bus): RESTART_BM [reboot]``."""
    return (f"Xid {v.code} on {v.pci} ({v.xid.name}): {v.resolution} "
            f"[{v.action}{': ' + v.why if v.why else ''}]")


def worst_first(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """The verdicts, the class needing the most first (log order within a class)."""
    return sorted(verdicts, key=lambda v: -CLASSES.index(v.action))
