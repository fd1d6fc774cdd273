"""Ansible's magic variables in inventory templates render as ansible-core renders them, on
real inventories that use them: DeepOps' virtual cluster (``artifacts_dir: "{{ inventory_dir
}}/artifacts"``, ``groups["kube_control_plane"][0]``) and Kubespray's sample
(``credentials_dir: "{{ inventory_dir }}/credentials"``). ansible-inventory gives the groups
(it does not template), a play of one debug task on every host (which contacts none) gives
what Ansible renders; gpufleet's ``inventory --list`` must give the same."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpufleet import app
from tests.conftest import ROOT

pytest.importorskip("ansible", reason="ansible-core (the dev extra) renders the reference")

FIXTURES = ROOT / "tests" / "fixtures" / "inventories"
# Every magic variable, read through a variable as an inventory would use it; the probe file
# goes into the copy's group_vars/all/, which both Ansible and gpufleet read.
PROBE = textwrap.dedent("""\
    probe_hostname: "{{ inventory_hostname }}"
    probe_hostname_short: "{{ inventory_hostname_short }}"
    probe_dir: "{{ inventory_dir }}"
    probe_file: "{{ inventory_file }}"
    probe_group_names: "{{ group_names }}"
    probe_groups: "{{ groups }}"
    probe_first_address: "{{ hostvars[groups['all'][0]]['ansible_host'] }}"
    probe_own_groups: "{{ hostvars[inventory_hostname].group_names }}"
    probe_second_file: "{{ hostvars[groups['all'][1]].inventory_file }}"
""")
PROBES = [line.split(":", 1)[0] for line in PROBE.splitlines()]
CASES = {
    # directory, the inventory path given to both, the fixture's own variables that use them
    "deepops-virtual": ("virtual_inventory", ["artifacts_dir", "k8s_nfs_server",
                                              "rsyslog_server_hostname",
                                              "rsyslog_client_tcp_host", "nfs_mounts",
                                              "nfs_exports"]),
    "kubespray-sample": (".", ["credentials_dir", "kube_config_dir", "kube_script_dir"]),
}
_OK = re.compile(r"^ok: \[(?P<host>[^\]]+)\] => (?P<body>\{\n.*?\n\})$", re.MULTILINE | re.DOTALL)


def ansible(module: str, *args: str, cwd: Path) -> str:
    """An ansible-core command line, run from the interpreter that runs the tests, with
    no configuration but its defaults."""
    (cwd / "ansible.cfg").touch()
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
           "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_HOST_KEY_CHECKING": "0",
           "ANSIBLE_CONFIG": str(cwd / "ansible.cfg"), "ANSIBLE_HOME": str(cwd / ".ansible")}
    done = subprocess.run([sys.executable, "-m", f"ansible.cli.{module}", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def rendered_by_ansible(inventory: Path, names: list[str], cwd: Path) -> dict[str, Any]:
    """Each host's values of ``names``, as a play's debug task renders them (None for a
    variable the host does not have)."""
    wanted = ", ".join(f"'{name}': ({name} if {name} is defined else none)" for name in names)
    play = cwd / "play.yml"
    play.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n"
                    f"    - ansible.builtin.debug:\n        msg: \"{{{{ {{{wanted}}} }}}}\"\n")
    out = ansible("playbook", "-i", str(inventory), str(play), cwd=cwd)
    return {m["host"]: json.loads(m["body"])["msg"] for m in _OK.finditer(out)}


def listed_by_gpufleet(inventory: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    capsys.readouterr()
    assert app.inventory_cmd(str(inventory), mode="list") == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", sorted(CASES))
def test_magic_variables_render_as_ansible_renders_them(
        case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / case
    shutil.copytree(FIXTURES / case, root)
    (root / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    (root / "group_vars" / "all" / "gf_probe.yml").write_text(PROBE)
    source, own = CASES[case]
    inventory = root / source if source != "." else root

    expected = rendered_by_ansible(inventory, PROBES + own, tmp_path)
    listing = listed_by_gpufleet(inventory, capsys)
    hostvars = listing["_meta"]["hostvars"]
    assert sorted(expected) == sorted(hostvars) and len(expected) >= 3
    for host, values in expected.items():
        assert {name: hostvars[host].get(name) for name in values} == values, host
    # the values themselves, not only agreement: the file that first named the host
    first = next(iter(expected.values()))
    assert first["probe_dir"] == str(inventory if inventory.is_dir() else inventory.parent)
    assert first["probe_file"].startswith(str(root) + "/")

    groups = json.loads(ansible("inventory", "-i", str(inventory), "--list", cwd=tmp_path))
    for group, entry in groups.items():
        if group != "_meta":
            assert listing[group] == entry, group
