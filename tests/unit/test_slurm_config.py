"""``scontrol show config`` read from real captures of Slurm 22.05.8 (the lab's slurmctld,
and one started per configuration), 19.05.5 and 2.3.2 (published), and the GPU GRES of
``scontrol show node`` by type; hostile output is a ParseError, never a guess."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import ParseError
from gpufleet.slurm.client import Slurm, SlurmNode, parse_show_node
from gpufleet.slurm.config import CGROUP, MAX_BYTES, parse_show_config
from tests.conftest import FIXTURES, stand_in

SLURM = FIXTURES / "slurm"


def _config(name: str) -> dict[str, str]:
    return parse_show_config((SLURM / f"scontrol_show_config_{name}.txt").read_text()).flat()


def test_the_main_part_and_the_cgroup_section_of_a_cgroup_configuration() -> None:
    config = parse_show_config((SLURM / "scontrol_show_config_cgroup.txt").read_text())
    assert config.version == "22.05.8"
    assert config.values["TaskPlugin"] == "task/cgroup,task/affinity"
    assert config.values["ProctrackType"] == "proctrack/cgroup"
    assert config.values["PropagateResourceLimits"] == "(null)"
    assert config.get("PropagateResourceLimits") is None
    assert config.get("PropagateResourceLimitsExcept") == "MEMLOCK"
    assert config.cgroup is not None and config.cgroup["ConstrainDevices"] == "yes"
    assert list(config.sections) == [CGROUP]
    assert config.get("ConstrainDevices") == "yes" and config.flat()["CgroupPlugin"] == \
        "autodetect"
    assert "ConstrainDevices" not in config.values


def test_values_with_spaces_equals_signs_brackets_and_nothing_are_kept() -> None:
    config = parse_show_config((SLURM / "scontrol_show_config_lab.txt").read_text())
    assert config.values["AuthInfo"].startswith("socket=/srv/")
    assert config.values["SlurmctldHost[0]"] == "gfjx-ctl(10.120.0.1)"
    assert config.values["PowerPlugin"] == "" and config.get("PowerPlugin") is None
    assert config.values["BatchStartTimeout"] == "10 sec"
    assert config.cgroup is None  # no cgroup plugin: slurmctld prints no section
    assert "Slurmctld(primary) at gfjx-ctl is UP" not in str(config.values)


@pytest.mark.parametrize(("name", "version", "cgroup"), [
    ("lab", "22.05.8", False), ("defaults", "22.05.8", True),
    ("no_cgroup_plugin", "22.05.8", False), ("except_nofile", "22.05.8", True),
    ("propagate_list", "22.05.8", True), ("propagate_none", "22.05.8", True),
    ("task_prolog", "22.05.8", False),
    ("19.05.5", "19.05.5", True), ("2.3.2", "2.3.2", False)])
def test_every_capture_is_read(name: str, version: str, cgroup: bool) -> None:
    config = parse_show_config((SLURM / f"scontrol_show_config_{name}.txt").read_text())
    assert config.version == version
    assert (config.cgroup is not None) == cgroup
    assert config.values["TaskPlugin"] and config.values["ProctrackType"]
    assert "PropagateResourceLimits" in config.values
    assert not any(key.startswith(("Configuration", "Slurmctld(")) for key in config.flat())


def test_a_configuration_without_a_cgroup_plugin_hides_cgroup_conf() -> None:
    # cgroup.conf said ConstrainDevices=yes, but with proctrack/linuxproc and task/affinity
    # slurmctld prints no section: the setting is not in effect for anything.
    assert "ConstrainDevices" not in _config("no_cgroup_plugin")
    assert _config("defaults")["ConstrainDevices"] == "no"


def test_old_and_published_layouts() -> None:
    spider = _config("19.05.5")
    assert spider["TaskPlugin"] == "affinity,cgroup"
    assert spider["ConstrainDevices"] == "no" and spider["TaskAffinity"] == "no"
    old = _config("2.3.2")
    assert old["ProctrackType"] == "proctrack/pgid" and old["SLURM_VERSION"] == "2.3.2"


def test_a_section_key_that_repeats_a_main_key_keeps_both() -> None:
    config = parse_show_config("A = 1\nB = main\n\nCgroup Support Configuration:\nB = section\n")
    assert config.values["B"] == "main" and config.sections[CGROUP]["B"] == "section"
    assert config.flat()["B"] == "main" and config.get("B") == "main"


@pytest.mark.parametrize("text", [
    "", "\n\n", "slurm_load_ctl_conf error: Unable to contact slurm controller\n",
    "Configuration data as of 2026-12-07T01:50:54\n\nSlurmctld(primary) at vm is UP\n",
    "<html>\n<body>not slurm</body>\n", "\x00\x01\x02 = \n"])
def test_output_without_a_single_pair_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError, match="scontrol show config: no 'Key = Value' lines"):
        parse_show_config(text)


def test_oversized_output_is_refused() -> None:
    with pytest.raises(ParseError, match="more than"):
        parse_show_config("A = 1\n" * (MAX_BYTES // 6 + 1))


def test_garbage_lines_among_pairs_are_ignored() -> None:
    text = (SLURM / "scontrol_show_config_lab.txt").read_text()
    config = parse_show_config("noise without an equals sign\n" + text + "\x1b[31mred\n")
    assert config.values["TaskPlugin"] == "task/none"


def test_config_runs_scontrol_show_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    captured = SLURM / "scontrol_show_config_cgroup.txt"
    stand_in(tmp_path, "scontrol",
             f'[ "$*" = "show config" ] || exit 9\ncat {captured}\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    config = Slurm(timeout=10).config()
    assert config.get("ConstrainDevices") == "yes"


def _node(name: str, node: str) -> SlurmNode:
    return next(n for n in parse_show_node((SLURM / name).read_text()) if n.name == node)


def test_gpu_gres_by_type() -> None:
    typed = _node("scontrol_show_node_gpu_typed.txt", "gpu001")
    assert typed.gres == "gpu:h100:8" and typed.gpu_types == (("h100", 8),) and typed.gpus == 8
    untyped = _node("scontrol_show_node_gpu_untyped.txt", "gpu001")
    assert untyped.gpu_types == ((None, 4),) and untyped.gpus == 4
    assert _node("scontrol_show_node_gpu_untyped.txt", "gpu002").gpu_types == (("a100", 4),)
    lab = _node("scontrol_show_node.txt", "node04")
    assert lab.gpu_types == ((None, 2),)


@pytest.mark.parametrize(("gres", "types"), [
    ("gpu:h200:8(S:0-1)", (("h200", 8),)),
    ("gpu:a100:4(S:0),gpu:v100:4(S:1)", (("a100", 4), ("v100", 4))),
    ("gpu:nvidia_h100_80gb_hbm3:8(S:0,2)", (("nvidia_h100_80gb_hbm3", 8),)),
    ("gpu:8,mps:800", ((None, 8),)),
    ("gpumem:80G,gpu:2", ((None, 2),)),
    ("", ()), ("(null)", ())])
def test_gpu_types_of_gres_strings(gres: str, types: tuple[tuple[str | None, int], ...]
                                   ) -> None:
    node = SlurmNode("n", "n", "n", "IDLE", 8, gres, (), ())
    assert node.gpu_types == types
    assert node.gpus == sum(count for _, count in types)
