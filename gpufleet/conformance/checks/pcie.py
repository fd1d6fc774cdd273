"""The pcie suite's verdicts, from the PCIe fact (gpufleet/facts/pcie.py): ACS redirection
on the bridges between each GPU and its nearest NICs, the IOMMU's mode, each GPU's and
NIC's link against what it is capable of, the NICs' Device Control where declared.

Each returns problems (the failure's lines) and unknowns (what could not be read), every
line naming the device by its PCI address.
"""

from __future__ import annotations

from typing import Any

from gpufleet.facts import pcie


def acs_problems(state: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Each GPU-NIC path with a bridge whose ACS redirects peer traffic: ``GPU g -> switch s
    -> NIC n: ACS ReqRedir+ CmpltRedir+ on port b`` (``s`` the deepest bridge both are
    below, ``b`` the port that redirects)."""
    problems: list[str] = []
    unknown: list[str] = []
    paths = pcie.gpu_nic_paths(state["devices"])
    if not paths:
        return problems, unknown
    if state["acs"] is None:
        return problems, [f"ACS: {state['acs_unknown'] or 'not read'}"]
    for path in paths:
        found = []
        for bridge in path["bridges"]:
            word = state["acs"].get(bridge)
            if isinstance(word, str):
                unknown.append(f"ACS of {bridge}: {word}")
            elif word is not None and (on := pcie.acs_redirects(word)):
                found.append(f"{' '.join(n + '+' for n in on)} on port {bridge}")
        if found:
            problems.append(f"GPU {path['gpu']} -> switch {path['shared']} -> NIC "
                            f"{path['nic']}: ACS {', '.join(found)}")
    return problems, sorted(set(unknown))


def iommu_problem(state: dict[str, Any]) -> tuple[str | None, str | None]:
    """(problem, unknown): the IOMMU translating the DMA of a GPU or NIC (its IOMMU group of
    type ``DMA`` or ``DMA-FQ``); unknown where IOMMUs are on but no group says its type and
    the command line does not ask for passthrough."""
    cmdline = state["cmdline"] or ""
    shown = " ".join(w for w in cmdline.split() if "iommu" in w) or "no iommu option"
    found = pcie.translating(state)
    if found:
        return (f"IOMMU in translation mode for {', '.join(found)} (kernel command line: "
                f"{shown}), expected passthrough (iommu=pt)", None)
    types = [d["iommu_group_type"] for d in state["devices"] if d["iommu_group_type"]]
    if types or not state["iommus"] or pcie.cmdline_passthrough(cmdline):
        return None, None
    return None, (f"IOMMU {', '.join(state['iommus'])} on, no IOMMU group type readable, "
                  f"kernel command line: {shown}")


def link_problems(state: dict[str, Any]) -> list[str]:
    """Each GPU and NIC link trained narrower than its device is capable of, and each NIC
    link slower. A GPU's speed is not judged: NVIDIA GPUs lower their link's speed when
    idle (nvidia-smi's ``pcie.link.gen.current``: "may be reduced when the GPU is not in
    use") and raise it under load."""
    problems = []
    for device in state["devices"]:
        name = f"{device['kind'].upper()} {device['address']}"
        width, most = device["width"], device["max_width"]
        if width is not None and most is not None and width < most:
            problems.append(f"{name}: link x{width}, capable of x{most}")
        speed, fastest = device["speed"], device["max_speed"]
        if device["kind"] == "nic" and speed is not None and fastest is not None \
                and speed < fastest:
            problems.append(f"{name}: link {speed:g} GT/s, capable of {fastest:g} GT/s")
    return problems


def devctl_problems(state: dict[str, Any], max_read_request: int | None,
                    relaxed_ordering: bool | None) -> tuple[list[str], list[str]]:
    """Each NIC whose Device Control differs from the declared maximum read request
    (``pcie_nic_max_read_request``) or relaxed ordering (``pcie_nic_relaxed_ordering``)."""
    problems: list[str] = []
    unknown: list[str] = []
    for device in state["devices"]:
        if device["kind"] != "nic":
            continue
        word = state["devctl"].get(device["address"])
        if not isinstance(word, int):
            unknown.append(f"NIC {device['address']}: Device Control: {word or 'not read'}")
            continue
        control = pcie.device_control(word)
        if max_read_request is not None and control["max_read_request"] != max_read_request:
            problems.append(f"NIC {device['address']}: MaxReadReq {control['max_read_request']} "
                            f"bytes, expected {max_read_request} (pcie_nic_max_read_request)")
        if relaxed_ordering is not None and control["relaxed_ordering"] != relaxed_ordering:
            have = "on" if control["relaxed_ordering"] else "off"
            want = "on" if relaxed_ordering else "off"
            problems.append(f"NIC {device['address']}: relaxed ordering {have}, expected "
                            f"{want} (pcie_nic_relaxed_ordering)")
    return problems, unknown
