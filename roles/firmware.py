"""Firmware versions: each RDMA device's (HCA) firmware, each GPU's VBIOS and GSP firmware,
and the BIOS, read in the facts round trip and compared two ways.

- Within each inventory group, by drift's consistency check, on every node whether or not
  anything is pinned: a node whose firmware differs from the rest of its group (after a
  partial update, a replaced board) is reported on that node. These values are compared
  even where a pin is declared (the role claims none of them, see ``shared_keys``): a pin
  may name one kind of firmware and not the others.
- Against ``firmware_pins``, per group or host (``{hca: "28.39.1002", vbios:
  "96.00.A5.00.1A", gsp: "580.159.04", bios: "2.1.V1"}``; ``hca`` may also map an HCA type
  or board id to its version where a node has NICs of several kinds): every device that
  differs is a drift item naming it, the version seen and the version pinned.

gpufleet never flashes firmware: a difference is a manual change (the vendor's tool updates
it: ``mlxfwmanager``/``flint`` for NVIDIA networking, the server vendor's tool or BMC for
the GPU's VBIOS and the BIOS; the GSP firmware ships with the driver).

``firmware_root`` names where /sys and /proc are read: ``/`` on a node, the lab's stand-in
tree there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from gpufleet.facts import catalog
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.provision.plan import MANUAL, Change
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var

PINS = "firmware_pins"
KINDS = ("hca", "vbios", "gsp", "bios")
CLASS = "configuration"
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._:/()+-]{0,63}\Z")
_HCA_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")


class FirmwareRole(RoleBase):
    name = "firmware"
    order = 22
    variables: ClassVar[Mapping[str, Var]] = {
        PINS: Var(None, "mapping", "the firmware every node must run: hca (one version, or "
                                   "HCA type / board id -> version), vbios, gsp, bios "
                                   "(null: compared within the group only)"),
        "firmware_root": Var("/", "string", "where /sys and /proc are read (the lab's "
                                            "stand-in tree)"),
    }

    # The firmware values are compared on every host, pinned or not: the role claims none of
    # them (a pin may name one kind of firmware and leave the others to the group).
    shared_keys = ()

    def active(self, v: RoleVars) -> bool:
        """On where the inventory pins any firmware."""
        return bool(v.get(PINS))

    def check(self, v: RoleVars) -> None:
        super().check(v)
        self.root(v)
        self.pins(v)

    @staticmethod
    def root(v: RoleVars) -> str:
        """``firmware_root`` as a path prefix: ``""`` for ``/``."""
        if v.string("firmware_root") == "/":
            return ""
        return v.path("firmware_root", "it prefixes the sysfs and procfs paths").rstrip("/")

    @staticmethod
    def pins(v: RoleVars) -> dict[str, Any]:
        """``firmware_pins`` checked: kind -> version (``hca``: a version, or a mapping of
        HCA type or board id to version)."""
        pins = v.mapping(PINS)
        expected = ("a mapping of hca, vbios, gsp, bios to versions (letters, digits, "
                    "space . _ : / ( ) + -)")
        for kind, version in pins.items():
            if kind not in KINDS:
                raise v.fail(PINS, expected + f"; unknown key {kind!r}", pins)
            if kind == "hca" and isinstance(version, dict):
                if not version or not all(
                        isinstance(k, str) and _HCA_KEY.match(k) and _is_version(value)
                        for k, value in version.items()):
                    raise v.fail(PINS, "an hca pin that maps HCA types or board ids "
                                 "(MT4129, MT_0000000838) to versions", pins)
            elif not _is_version(version):
                raise v.fail(PINS, expected + f"; bad {kind} version {version!r}", pins)
        return {kind: ({k: str(x) for k, x in value.items()} if isinstance(value, dict)
                       else str(value)) for kind, value in pins.items()}

    # ---- facts --------------------------------------------------------------------------

    def _facts(self, v: RoleVars) -> FactRequest:
        root = self.root(v)
        return FactRequest(custom=frozenset({catalog.hca_firmware_fact(root),
                                             catalog.bios_fact(root),
                                             catalog.gsp_firmware_fact(root)}))

    def request(self, v: RoleVars) -> FactRequest:
        return self._facts(v)

    def shared_request(self, v: RoleVars) -> FactRequest:
        return self._facts(v)

    def shared(self, facts: Facts, v: RoleVars) -> dict[str, str | None]:
        """The firmware every node of a group must share (None where the host has none of
        that kind: no RDMA device, no GPU, no DMI table)."""
        hca, gsp, vbios = _hca(facts), facts.get("gsp_firmware"), _vbios(facts, bus=False)
        bios = facts.get("bios")
        return {
            "hca_firmware": _versions({d: e["fw_ver"] for d, e in hca.items()})
            if hca else None,
            "gpu_vbios": _versions(vbios) if vbios else None,
            "gsp_firmware": _versions(gsp) if gsp else None,
            "bios": _bios(bios) if bios else None,
        }

    # ---- plan ---------------------------------------------------------------------------

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        pins = self.pins(v)
        changes: list[Change] = []
        if "hca" in pins:
            changes += self._hca(facts, pins["hca"])
        if "vbios" in pins:
            changes += self._per_device(facts, "vbios", _vbios(facts), "gpus",
                                        pins["vbios"])
        if "gsp" in pins:
            changes += self._per_device(facts, "gsp", _gsp(facts), "gsp_firmware",
                                        pins["gsp"])
        if "bios" in pins:
            bios = facts.get("bios")
            seen = bios["bios_version"] if bios else None
            if seen != pins["bios"]:
                changes.append(self._change("bios", seen or self._unknown(facts, "bios"),
                                            pins["bios"], "bios"))
        return changes

    def _hca(self, facts: Facts, pin: str | dict[str, str]) -> list[Change]:
        devices = _hca(facts)
        if not devices:
            return [self._change("hca", self._unknown(facts, "hca_firmware"),
                                 _shown(pin), "hca")]
        changes = []
        for device, entry in devices.items():
            if isinstance(pin, str):
                want: str | None = pin
            else:
                want = pin.get(entry["hca_type"] or "") or pin.get(entry["board_id"] or "")
            if want is not None and entry["fw_ver"] != want:
                kind = " ".join(x for x in (entry["hca_type"], entry["board_id"]) if x)
                changes.append(self._change(f"hca {device}" + (
                    f" ({kind})" if kind else ""), entry["fw_ver"] or "unknown", want, "hca"))
        return changes

    def _per_device(self, facts: Facts, kind: str, seen: dict[str, str | None], fact: str,
                    pin: str) -> list[Change]:
        if not seen:
            return [self._change(kind, self._unknown(facts, fact), pin, kind)]
        return [self._change(f"{kind} {device}", version or "unknown", pin, kind)
                for device, version in seen.items() if version != pin]

    @staticmethod
    def _unknown(facts: Facts, fact: str) -> str:
        return f"unknown ({facts.why_absent(fact)})"

    def _change(self, resource: str, seen: str, pinned: str, kind: str) -> Change:
        return Change(self.name, resource, MANUAL, seen, f"{pinned} ({PINS}.{kind})",
                      kind="firmware", finding_class=CLASS)


def _versions(values: dict[str, str | None]) -> str:
    """``28.39.1002`` where every device has that version, else each version with its
    devices (``28.37.1014 (mlx5_1), 28.39.1002 (mlx5_0)``); ``values``: device -> version
    (None: unknown)."""
    by_version: dict[str, list[str]] = {}
    for device, version in values.items():
        by_version.setdefault("unknown" if version is None else version, []).append(device)
    if len(by_version) == 1:
        return next(iter(by_version))
    return ", ".join(f"{version} ({', '.join(devices)})"
                     for version, devices in sorted(by_version.items()))


def _is_version(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool) and \
        bool(_VERSION.match(str(value)))


def _shown(pin: str | dict[str, str]) -> str:
    return pin if isinstance(pin, str) else ", ".join(f"{k} {x}" for k, x in pin.items())


def _hca(facts: Facts) -> dict[str, dict[str, str | None]]:
    value: dict[str, dict[str, str | None]] = facts.get("hca_firmware") or {}
    return value


def _vbios(facts: Facts, bus: bool = True) -> dict[str, str | None]:
    """Each GPU's VBIOS from nvidia-smi's query: ``GPU 0 (00000000:18:00.0)`` (``GPU 0``
    without ``bus``) -> version."""
    return {f"GPU {g.get('index')}" + (f" ({g.get('pci.bus_id')})" if bus else ""):
            g.get("vbios_version") for g in facts.get("gpus") or []}


def _gsp(facts: Facts) -> dict[str, str | None]:
    """Each GPU's GSP firmware by bus id (``off``: the GPU runs without GSP firmware)."""
    return {f"GPU {bus}": version for bus, version in (facts.get("gsp_firmware") or {}).items()}


def _bios(bios: dict[str, str | None]) -> str:
    date = f" ({bios['bios_date']})" if bios.get("bios_date") else ""
    return f"{bios['bios_version']}{date}"


ROLE = FirmwareRole()
