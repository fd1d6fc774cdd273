"""RoCE QoS on RDMA NICs: PFC, trust, DSCP map and ECN, read from mlnx_qos or (without it)
iproute2's dcb, in one round trip per node (``checks/rdma.py`` judges them)."""

from __future__ import annotations

import shlex

from gpufleet.conformance.checks.rdma import RoceState
from gpufleet.conformance.session import Node
from gpufleet.errors import ParseError
from gpufleet.facts import script
from gpufleet.facts.parsers import network
from gpufleet.facts.parsers.qos import dcb_pfc_json, mlnx_qos


def read_command(netdev: str) -> list[tuple[str, str]]:
    """Sections of the one-round-trip script that reads a netdev's QoS."""
    q = shlex.quote(netdev)
    return [
        ("mlnx_qos", f"command -v mlnx_qos >/dev/null || exit 127; mlnx_qos -i {q}"),
        ("dcb_pfc", f"command -v dcb >/dev/null || exit 127; dcb -j pfc show dev {q}"),
        ("ecn", f"for p in 0 1 2 3 4 5 6 7; do echo \"$p $(cat /sys/class/net/{q}/ecn/roce_np/"
                f"enable/$p 2>/dev/null || echo -) $(cat /sys/class/net/{q}/ecn/roce_rp/enable/"
                "$p 2>/dev/null || echo -)\"; done"),
        ("ethtool", f"command -v ethtool >/dev/null || exit 127; ethtool -S {q}"),
    ]


def parse_state(netdev: str, sections: dict[str, script.Section]) -> RoceState:
    """Combine the sections into a RoceState (pure)."""
    state = RoceState(netdev)
    qos = sections.get("mlnx_qos")
    dcb = sections.get("dcb_pfc")
    if qos is not None and qos.rc == 0:
        state.tool = "mlnx_qos"
        try:
            parsed = mlnx_qos(qos.text)
            state.trust, state.pfc_enabled = parsed["trust"], parsed["pfc_enabled"]
            state.dscp2prio = parsed["dscp2prio"]
        except ParseError as exc:
            state.unknown.append(f"mlnx_qos output unreadable: {exc}")
    elif dcb is not None and dcb.rc == 0:
        state.tool = "dcb"
        try:
            state.pfc_enabled = dcb_pfc_json(dcb.text)["prio_pfc"]
        except ParseError as exc:
            state.unknown.append(f"dcb output unreadable: {exc}")
        state.unknown.append("trust mode and DSCP map (mlnx_qos not installed)")
    else:
        state.unknown.append("PFC and trust (neither mlnx_qos nor dcb could read them)")
    ecn = sections.get("ecn")
    for line in (ecn.text.splitlines() if ecn else []):
        prio, np_, rp = [*line.split(), "-", "-"][:3]
        if np_ != "-" and rp != "-" and prio.isdigit():
            state.ecn[int(prio)] = (np_.strip() == "1", rp.strip() == "1")
    counters = sections.get("ethtool")
    if counters is not None and counters.rc == 0:
        try:
            state.counters = network.pause_and_discard_counters(
                network.ethtool_stats(counters.text))
        except ParseError:
            state.unknown.append("ethtool -S counters unreadable")
    return state


def read_state(node: Node, netdev: str) -> RoceState:
    nonce = script.new_nonce()
    sections = read_command(netdev)
    result = node.run(script.compose(sections, nonce), timeout=60)
    return parse_state(netdev, script.split(result.stdout, nonce))
