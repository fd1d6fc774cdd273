"""The mlnx_qos, dcb -j pfc and CDI spec readers held to further real captures: two current
mlnx_qos layouts (receive buffers, a ``buffer`` row, ETS and strict TCs, firmware DCBX), what
``dcb -j pfc show`` prints for a netdev that does not exist, and the CDI specs of NVIDIA
Container Toolkit 1.20 on a T4 and of nvidia-ctk on WSL2 (sources in
tests/fixtures/published/README.md and tests/fixtures/cdi/README.md)."""

from __future__ import annotations

import pytest

from gpufleet.conformance.checks import rdma as rdma_checks
from gpufleet.conformance.measure import rdma
from gpufleet.errors import ParseError
from gpufleet.facts import containers, script
from gpufleet.facts.parsers import qos as qos_parsers
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
PUBLISHED = FIXTURES / "published"

# the map every one of these NICs reports: dscp 8p..8p+7 on priority p
DEFAULT_DSCP2PRIO = {dscp: dscp >> 3 for dscp in range(64)}


def published(name: str) -> str:
    return (PUBLISHED / name).read_text()


# --------------------------------------------------------------------------- mlnx_qos


def test_mlnx_qos_of_a_connectx7_with_ets_and_strict_tcs_and_pfc_on_priority_5() -> None:
    """MLNX_OFED 23.10 on a ConnectX-7: an empty ``default priority:``, receive buffers with
    their maximum, a ``buffer`` row under the PFC flags, four ETS TCs whose shares add to 100
    and four strict ones."""
    qos = qos_parsers.mlnx_qos(
        published("mlnx-qos-i-connectx7-mlnx-ofed-23.10-ets-strict-pfc5.txt"))
    assert (qos["trust"], qos["pfc_enabled"]) == ("dscp", [5])
    assert qos["dscp2prio"] == DEFAULT_DSCP2PRIO
    assert qos["tc"] == {
        0: {"tsa": "ets", "bw": 9, "priorities": [0]},
        1: {"tsa": "ets", "bw": 1, "priorities": [1]},
        2: {"tsa": "ets", "bw": 80, "priorities": [2]},
        3: {"tsa": "ets", "bw": 10, "priorities": [3]},
        **{tc: {"tsa": "strict", "bw": None, "priorities": [tc]} for tc in range(4, 8)},
    }


def test_rdma_verdict_on_the_connectx7_capture_matches_its_own_roce_tos() -> None:
    """The same host set RoCE's ToS to 162 (DSCP 40) for lossless priority 5: the rdma
    verdict finds nothing wrong, and names the difference against the usual priority 3."""
    qos = published("mlnx-qos-i-connectx7-mlnx-ofed-23.10-ets-strict-pfc5.txt")
    state = rdma.parse_state("ens4np0", {
        "mlnx_qos": script.Section("mlnx_qos", 0, qos),
        "ecn": script.Section("ecn", 0, "".join(
            f"{p} {int(p == 5)} {int(p == 5)}\n" for p in range(8)))})
    assert rdma_checks.problems(state, {"pfc_priority": 5, "trust": "dscp", "ecn": True}, 162) == []
    assert rdma_checks.problems(state, {"pfc_priority": 3, "trust": "dscp"}, 106) == [
        "ens4np0: PFC enabled on [5], expected only priority 3"]


def test_mlnx_qos_of_a_connectx5_under_firmware_dcbx_with_six_priorities_on_tc0() -> None:
    """DOCA 3.2's mlnx_qos on a ConnectX-5 whose switch set PFC and ETS by DCBX: only TCs 0, 3
    and 6 are listed, tc 0 carries six priorities, and tc 6 is the vendor TC."""
    qos = qos_parsers.mlnx_qos(published("mlnx-qos-i-connectx5-firmware-dcbx-doca-3.2.txt"))
    assert (qos["trust"], qos["pfc_enabled"]) == ("dscp", [3])
    assert qos["dscp2prio"] == DEFAULT_DSCP2PRIO
    assert qos["tc"] == {
        0: {"tsa": "ets", "bw": 50, "priorities": [0, 1, 2, 4, 5, 7]},
        3: {"tsa": "ets", "bw": 50, "priorities": [3]},
        6: {"tsa": "vendor", "bw": None, "priorities": [6]},
    }


# --------------------------------------------------------------------------- dcb -j pfc


def test_dcb_j_pfc_of_a_missing_netdev_is_a_parse_error() -> None:
    """iproute2 6.1's ``dcb -j pfc show dev`` of a name that is no netdev: an error on stderr
    and an empty line on stdout, never an empty PFC map."""
    with pytest.raises(ParseError, match="'Attribute read: No such device'"):
        qos_parsers.dcb_pfc_json(published("dcb-j-pfc-show-missing-dev-iproute2-6.1.txt"))


# --------------------------------------------------------------------------- CDI spec


def test_cdi_spec_of_toolkit_1_20_with_device_node_modes_and_hook_env() -> None:
    """The spec NVIDIA Container Toolkit 1.20 left in /var/run/cdi on a T4 VM (driver
    615.71.09, Rocky Linux 9): device nodes with major/minor/fileMode/gid, hooks with an
    ``env``, ``additionalGids``; the driver is the one ``enable-cuda-compat`` names, the
    same as the versioned libcuda it mounts."""
    text = (FIXTURES / "cdi" / "nvidia-gcp-t4-615.71.09-toolkit-1.20.0.yaml").read_text()
    spec = containers.cdi_spec(text)
    assert spec == containers.CdiSpec(
        kind="nvidia.com/gpu",
        devices=["0", "GPU-8f1f4d06-07fd-27a7-52d5-e58aa060d256", "all"],
        uuids=["GPU-8f1f4d06-07fd-27a7-52d5-e58aa060d256"],
        driver="615.71.09")
    without_hook = text.replace("--host-driver-version=615.71.09", "--folder")
    assert containers.cdi_spec(without_hook).driver == "615.71.09"


def test_cdi_spec_of_wsl2_names_no_driver() -> None:
    """nvidia-ctk's spec on WSL2: one ``all`` device on /dev/dxg and the Windows driver
    store's ``libcuda.so.1.1``, whose suffix is the library's SONAME, not a driver version;
    the spec names no driver, so a check of it must not read one."""
    text = (FIXTURES / "cdi" / "nvidia-wsl2-nvidia-ctk-cdiversion-0.3.0.yaml").read_text()
    assert containers.cdi_spec(text) == containers.CdiSpec(
        kind="nvidia.com/gpu", devices=["all"], uuids=[], driver=None)
