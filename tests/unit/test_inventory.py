"""Tests for loading Ansible-compatible static inventories."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from gpufleet.errors import InventoryError
from gpufleet.inventory.load import load_inventory, resolve_inventory
from gpufleet.inventory.model import Host, Inventory

FIXTURES = Path(__file__).parent.parent / "fixtures" / "inventories"
ATLAS = FIXTURES / "atlas"
ATLAS_INI = FIXTURES / "atlas-ini" / "hosts.ini"
PROXY_ARGS = [
    "-o",
    "ProxyJump=ops@bastion.atlas.example.net",
    "-o",
    "StrictHostKeyChecking=accept-new",
]


def write(root: Path, name: str, text: str) -> Path:
    """Write a dedented file below root, creating directories, and return its path."""
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def names(inventory: Inventory, pattern: str | None = None) -> list[str]:
    return [host.name for host in inventory.select(pattern)]


def load_error(path: Path) -> str:
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    return str(caught.value)


# Resolving -----------------------------------------------------------------------------------


def test_resolve_tries_yml_yaml_ini_then_directory(tmp_path: Path) -> None:
    write(tmp_path, "prod.ini", "gpu01\n")
    write(tmp_path, "prod/hosts.ini", "gpu01\n")
    assert resolve_inventory("prod", [tmp_path]) == tmp_path / "prod.ini"
    write(tmp_path, "prod.yaml", "all:\n")
    assert resolve_inventory("prod", [tmp_path]) == tmp_path / "prod.yaml"
    write(tmp_path, "prod.yml", "all:\n")
    assert resolve_inventory("prod", [tmp_path]) == tmp_path / "prod.yml"
    write(tmp_path, "lab/hosts.yml", "all:\n")
    assert resolve_inventory("lab", [tmp_path]) == tmp_path / "lab"


def test_resolve_returns_an_existing_path_as_given(tmp_path: Path) -> None:
    assert resolve_inventory(str(ATLAS_INI), [tmp_path]) == ATLAS_INI
    assert resolve_inventory(str(ATLAS), [tmp_path]) == ATLAS


def test_resolve_names_everything_it_tried(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as caught:
        resolve_inventory("staging", [tmp_path])
    tried = ", ".join(
        str(path)
        for path in (
            tmp_path / "staging.yml",
            tmp_path / "staging.yaml",
            tmp_path / "staging.ini",
            tmp_path / "staging",
            Path("staging"),
        )
    )
    assert str(caught.value) == f"inventory 'staging' not found; tried {tried}"


def test_load_inventory_resolves_a_name_under_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "inventory/lab.yml", "all:\n  hosts:\n    node1:\n")
    monkeypatch.chdir(tmp_path)
    inventory = load_inventory("lab")
    assert inventory.path == Path("inventory/lab.yml")
    assert list(inventory.hosts) == ["node1"]


# The atlas fixture (YAML directory and INI file) ---------------------------------------------


@pytest.fixture(scope="module")
def atlas() -> Inventory:
    return load_inventory(ATLAS)


def test_atlas_hosts_in_definition_order(atlas: Inventory) -> None:
    expected = [
        "bastion.atlas.example.net",
        *(f"gpu{n:02d}" for n in range(1, 17)),
        *(f"h100-{letter}" for letter in "abcdefgh"),
        "login01",
        "nfs01",
        "localhost",
    ]
    assert list(atlas.hosts) == expected


def test_atlas_groups_include_children_and_implicit_groups(atlas: Inventory) -> None:
    assert len(atlas.groups["all"]) == 28
    assert atlas.groups["ungrouped"] == {"bastion.atlas.example.net"}
    assert len(atlas.groups["gpu"]) == 24
    assert atlas.groups["gpu"] == atlas.groups["h200"] | atlas.groups["h100"]
    assert atlas.groups["rack_b"] == {f"gpu{n:02d}" for n in range(9, 17)} | atlas.groups["h100"]
    assert atlas.hosts["gpu01"].groups == {"all", "gpu", "h200", "rack_a"}
    assert atlas.hosts["bastion.atlas.example.net"].groups == {"all", "ungrouped"}


def test_atlas_sources_skip_docs_and_known_hosts(atlas: Inventory) -> None:
    relative = [source.relative_to(ATLAS).as_posix() for source in atlas.sources]
    assert relative == [
        "hosts.yml",
        "racks.yml",
        "group_vars/all.yml",
        "group_vars/gpu.yml",
        "group_vars/h200/main.yml",
        "group_vars/h200/nccl.yml",
        "host_vars/gpu01.json",
        "host_vars/login01",
    ]


def test_atlas_variables_follow_group_depth_and_host_vars(atlas: Inventory) -> None:
    gpu01, gpu02, h100 = atlas.hosts["gpu01"], atlas.hosts["gpu02"], atlas.hosts["h100-a"]
    assert [host.vars["driver_branch"] for host in (gpu01, h100, atlas.hosts["nfs01"])] == [
        "560",
        "550",
        "535",
    ]
    assert gpu01.vars["gpus_per_node"] == 7
    assert gpu02.vars["gpus_per_node"] == 8
    assert gpu02.vars["nccl_socket_ifname"] == "bond0"
    assert h100.vars["nccl_socket_ifname"] == "ib0"
    assert gpu02.vars["nccl_env"]["NCCL_SOCKET_IFNAME"] == "bond0"
    assert gpu02.vars["ntp_servers"] == ["10.10.0.2", "10.10.0.3"]
    assert gpu02.vars["rack"] == "a"
    assert type(gpu02.vars["nccl_env"]) is dict


def test_atlas_connection_settings(atlas: Inventory) -> None:
    gpu01, login, nfs = atlas.hosts["gpu01"], atlas.hosts["login01"], atlas.hosts["nfs01"]
    bastion, local = atlas.hosts["bastion.atlas.example.net"], atlas.hosts["localhost"]
    assert (gpu01.address, gpu01.port, gpu01.user) == ("10.20.0.101", 22, "ops")
    assert (login.address, login.port, login.private_key_file) == (
        "10.10.0.5",
        2222,
        "~/.ssh/atlas_login",
    )
    assert (nfs.address, nfs.port) == ("10.10.0.9", 2200)
    assert (bastion.user, bastion.ssh_common_args) == ("jump", [])
    assert gpu01.ssh_common_args == PROXY_ARGS
    assert (gpu01.connection, local.connection) == ("ssh", "local")
    assert (gpu01.become, local.become, gpu01.become_user) == (True, False, "root")


def test_atlas_ini_describes_the_same_cluster(atlas: Inventory) -> None:
    ini = load_inventory(ATLAS_INI)

    def summary(inventory: Inventory) -> list[tuple[object, ...]]:
        return [
            (h.name, h.address, h.port, h.user, h.connection, h.become, h.private_key_file,
             h.ssh_common_args, h.groups, h.vars["driver_branch"], h.vars.get("rack"))
            for h in inventory.hosts.values()
        ]  # fmt: skip

    assert summary(ini) == summary(atlas)
    assert ini.groups == atlas.groups
    assert ini.hosts["gpu02"].vars["gpus_per_node"] == 8


def test_group_vars_are_the_groups_own(atlas: Inventory) -> None:
    assert atlas.group_vars("h200") == {
        "gpus_per_node": 8,
        "gpu_model": "H200",
        "hbm_gb": 141,
        "driver_branch": "560",
        "fabricmanager": True,
        "nccl_socket_ifname": "bond0",
        "nccl_env": {
            "NCCL_IB_HCA": "mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11",
            "NCCL_SOCKET_IFNAME": "bond0",
        },
    }
    assert atlas.group_vars("storage") == {}
    atlas.group_vars("h200")["nccl_env"].clear()
    assert atlas.group_vars("h200")["nccl_env"]


def test_group_vars_of_an_unknown_group(atlas: Inventory) -> None:
    with pytest.raises(InventoryError) as caught:
        atlas.group_vars("h300")
    assert str(caught.value) == f"{ATLAS}: unknown group 'h300'"


# Precedence ----------------------------------------------------------------------------------


def test_precedence_all_parent_child_host(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", """
        all:
          vars: {level: all, from_all: 1, from_parent: 0, from_child: 0}
          children:
            gpu:
              vars: {level: parent, from_parent: 1, from_child: 0}
              children:
                h200:
                  vars: {level: child, from_child: 1}
                  hosts:
                    gpu01: {level: host}
                    gpu02:
    """)  # fmt: skip
    inventory = load_inventory(path)
    assert inventory.hosts["gpu01"].vars == {
        "level": "host", "from_all": 1, "from_parent": 1, "from_child": 1,
    }  # fmt: skip
    assert inventory.hosts["gpu02"].vars["level"] == "child"


def test_precedence_group_vars_files_and_host_vars(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", """
        [gpu]
        gpu01 role=inline
        gpu02

        [gpu:vars]
        role=inventory
        only_inventory=kept
    """)
    write(tmp_path, "group_vars/gpu.yml", "role: group_vars\n")
    write(tmp_path, "host_vars/gpu01.yaml", "role: host_vars\n")
    inventory = load_inventory(path)
    assert inventory.hosts["gpu01"].vars["role"] == "host_vars"
    assert inventory.hosts["gpu02"].vars == {"role": "group_vars", "only_inventory": "kept"}
    assert inventory.group_vars("gpu") == {"role": "group_vars", "only_inventory": "kept"}


def test_precedence_inventory_file_vars_of_any_group_lose_to_group_vars_files(
    tmp_path: Path,
) -> None:
    # Ansible merges every group's inventory-file vars before any group_vars/ file.
    path = write(tmp_path, "hosts.ini", """
        [gpu]
        gpu01

        [gpu:vars]
        driver=from_inventory_file
    """)
    write(tmp_path, "group_vars/all.yml", "driver: from_group_vars_all\n")
    assert load_inventory(path).hosts["gpu01"].vars["driver"] == "from_group_vars_all"


def test_only_the_first_group_vars_candidate_is_read(tmp_path: Path) -> None:
    # Ansible's host_group_vars plugin reads the first of NAME, NAME.yml, NAME.yaml and
    # NAME.json that exists and stops there.
    path = write(tmp_path, "hosts.yml", "gpu:\n  hosts:\n    gpu01:\n")
    write(tmp_path, "group_vars/gpu", "a: bare\nb: bare\n")
    write(tmp_path, "group_vars/gpu.yml", "b: yml\nc: yml\n")
    write(tmp_path, "group_vars/gpu.json", '{"d": "json"}\n')
    write(tmp_path, "group_vars/gpu.yaml", "c: yaml\nd: yaml\n")
    write(tmp_path, "group_vars/all/10-base.yml", "x: base\n")
    write(tmp_path, "group_vars/all/20-site/net.yml", "x: site\n")
    write(tmp_path, "group_vars/all/.hidden.yml", "x: hidden\n")
    write(tmp_path, "group_vars/all/notes.md", "x: markdown\n")
    write(tmp_path, "group_vars/all.yml", "x: not-read-the-directory-comes-first\n")
    inventory = load_inventory(path)
    assert inventory.hosts["gpu01"].vars == {"a": "bare", "b": "bare", "x": "site"}
    relative = [source.relative_to(tmp_path).as_posix() for source in inventory.sources]
    assert relative == ["hosts.yml", "group_vars/all/10-base.yml",
                        "group_vars/all/20-site/net.yml", "group_vars/gpu"]


@pytest.mark.parametrize("present", [(".yml",), (".yaml", ".json"), (".json",)])
def test_the_first_existing_extension_wins(tmp_path: Path, present: tuple[str, ...]) -> None:
    path = write(tmp_path, "hosts.yml", "gpu:\n  hosts:\n    gpu01:\n")
    for suffix in present:
        write(tmp_path, f"host_vars/gpu01{suffix}", f'{{"from": "{suffix}"}}\n')
    assert load_inventory(path).hosts["gpu01"].vars == {"from": present[0]}


def test_same_depth_groups_merge_alphabetically(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", """
        [zeta]
        gpu01
        [alpha]
        gpu01
        [zeta:vars]
        winner=zeta
        [alpha:vars]
        winner=alpha
    """)
    assert load_inventory(path).hosts["gpu01"].vars["winner"] == "zeta"


def test_group_priority_overrides_alphabetical_order(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", """
        [zeta]
        gpu01
        [alpha]
        gpu01
        [zeta:vars]
        winner=zeta
        [alpha:vars]
        winner=alpha
        ansible_group_priority=10
    """)
    inventory = load_inventory(path)
    assert inventory.hosts["gpu01"].vars == {"winner": "alpha"}
    assert inventory.group_vars("alpha") == {"winner": "alpha"}


def test_group_priority_does_not_beat_a_deeper_group(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", """
        gpu:
          vars: {winner: gpu, ansible_group_priority: 100}
          children:
            h200:
              vars: {winner: h200}
              hosts: {gpu01: }
    """)
    assert load_inventory(path).hosts["gpu01"].vars["winner"] == "h200"


# Formats -------------------------------------------------------------------------------------


def test_ini_values_inline_and_in_group_vars(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", """
        # whole-line comment
        ; another comment
        [gpu]
        gpu01 count=8 ratio=0.5 on=True off=False yes=yes items="[1, 'a']" text="two words" pw="pa#ss" cut=a#b after=1 # note
        gpu02 quoted="'0755'" mode=0755 none=None

        [gpu:vars]   # section comment
        count=8
        flag=True
        greeting="hello world"
        note=kept # not a comment in :vars
        port=2222 # a comment after a Python literal
    """)  # noqa: E501
    hosts = load_inventory(path).hosts
    assert hosts["gpu01"].vars == {
        "count": 8, "ratio": 0.5, "on": True, "off": False, "yes": "yes", "items": [1, "a"],
        "text": "two words", "pw": "pa#ss", "cut": "a",
        "flag": True, "greeting": "hello world", "note": "kept # not a comment in :vars",
        "port": 2222,
    }  # fmt: skip
    assert hosts["gpu02"].vars["quoted"] == "0755"
    assert hosts["gpu02"].vars["mode"] == "0755"
    assert hosts["gpu02"].vars["none"] is None
    assert hosts["gpu02"].vars["count"] == 8


def test_ini_hosts_before_sections_are_ungrouped(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts", """
        jump01
        gpu01
        [gpu]
        gpu01
        [ungrouped:vars]
        role=jump
    """)
    inventory = load_inventory(path)
    assert inventory.groups["ungrouped"] == {"jump01"}
    assert inventory.hosts["jump01"].vars == {"role": "jump"}
    assert inventory.hosts["gpu01"].groups == {"all", "gpu"}


def test_yaml_hosts_and_groups_may_be_null(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yaml", """
        all:
          hosts:
            jump01:
          children:
            empty:
            gpu:
              hosts:
                gpu01:
        storage:
          hosts:
    """)
    inventory = load_inventory(path)
    assert list(inventory.hosts) == ["jump01", "gpu01"]
    assert inventory.groups == {
        "all": {"jump01", "gpu01"}, "ungrouped": {"jump01"}, "empty": set(), "gpu": {"gpu01"},
        "storage": set(),
    }  # fmt: skip


def test_yaml_sections_given_as_one_string(tmp_path: Path) -> None:
    # Ansible reads "hosts: name" as {name: null}; the same for children and vars.
    path = write(tmp_path, "hosts.yml", "gpu:\n  hosts: gpu01\n  vars: flag\n  children: h200\n")
    inventory = load_inventory(path)
    assert inventory.groups["gpu"] == {"gpu01"}
    assert inventory.children("gpu") == ["h200"]
    assert inventory.group_vars("gpu") == {"flag": None}


def test_yaml_unsafe_strings_are_plain_strings(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", "all:\n  hosts:\n    n1:\n      msg: !unsafe '{{ raw }}'\n")
    assert load_inventory(path).hosts["n1"].vars["msg"] == "{{ raw }}"


def test_yaml_anchors_and_merge_keys(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", """
        gpu:
          vars:
            <<: &defaults {driver: "550", mtu: 1500}
            mtu: 9000
          hosts:
            gpu01:
              <<: *defaults
    """)
    inventory = load_inventory(path)
    assert inventory.group_vars("gpu") == {"driver": "550", "mtu": 9000}
    assert inventory.hosts["gpu01"].vars == {"driver": "550", "mtu": 1500}


def test_empty_inventory_file(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, "hosts.ini", "# nothing yet\n"))
    assert (inventory.hosts, inventory.groups) == ({}, {"all": set(), "ungrouped": set()})
    assert inventory.select() == []


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("hosts", "all:\n  hosts:\n    node1:\n      ansible_port: 2201\n"),
        ("hosts", "node1 ansible_port=2201\n"),
        ("hosts.json", '{"all": {"hosts": {"node1": {"ansible_port": 2201}}}}\n'),
        ("hosts.cluster", "[nodes]\nnode1:2201\n"),
    ],
)
def test_format_detection(tmp_path: Path, name: str, text: str) -> None:
    inventory = load_inventory(write(tmp_path, name, text))
    assert [(host.name, host.port) for host in inventory.hosts.values()] == [("node1", 2201)]


def test_directory_inventory_merges_files_and_skips_the_rest(tmp_path: Path) -> None:
    write(tmp_path, "inv/10-gpu.ini", "[gpu]\ngpu01\n")
    write(tmp_path, "inv/20-racks.yml", "rack_a:\n  hosts:\n    gpu01:\n    gpu02:\n")
    write(tmp_path, "inv/sub/30-login", "[login]\nlogin01\n")
    for skipped in ("README.md", "old.retry", "cache.pyc", "known_hosts", "known_hosts.old",
                    ".hidden.ini", "notes.txt", "ansible.cfg", "hosts.ini~"):  # fmt: skip
        write(tmp_path, f"inv/{skipped}", "this is [not an inventory\n")
    write(tmp_path, "inv/group_vars/gpu.yml", "driver: '560'\n")
    write(tmp_path, "inv/sub/group_vars/gpu.yml", "driver: 'ignored'\n")
    inventory = load_inventory(tmp_path / "inv")
    assert list(inventory.hosts) == ["gpu01", "gpu02", "login01"]
    assert inventory.groups["rack_a"] == {"gpu01", "gpu02"}
    assert inventory.hosts["gpu01"].vars == {"driver": "560"}
    assert [source.relative_to(tmp_path / "inv").as_posix() for source in inventory.sources] == [
        "10-gpu.ini", "20-racks.yml", "sub/30-login", "group_vars/gpu.yml",
    ]  # fmt: skip


def test_host_defined_in_several_places_merges_its_vars(tmp_path: Path) -> None:
    write(tmp_path, "inv/a.ini", "[gpu]\ngpu01 ansible_host=10.0.0.1 a=1\n")
    write(tmp_path, "inv/b.yml", "rack:\n  hosts:\n    gpu01: {ansible_host: 10.0.0.1, b: 2}\n")
    inventory = load_inventory(tmp_path / "inv")
    assert inventory.hosts["gpu01"].vars == {"ansible_host": "10.0.0.1", "a": 1, "b": 2}
    assert inventory.hosts["gpu01"].groups == {"all", "gpu", "rack"}


# Host ranges ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("gpu[01:03]", ["gpu01", "gpu02", "gpu03"]),
        ("gpu[8:11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
        ("gpu[098:101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("node-[a:c]", ["node-a", "node-b", "node-c"]),
        ("node-[X:Z].lab", ["node-X.lab", "node-Y.lab", "node-Z.lab"]),
        ("gpu[01:07:3]", ["gpu01", "gpu04", "gpu07"]),
        ("n[a:e:2]", ["na", "nc", "ne"]),
        ("r[1:2]-gpu[a:b]", ["r1-gpua", "r1-gpub", "r2-gpua", "r2-gpub"]),
        ("gpu[:2]", ["gpu0", "gpu1", "gpu2"]),
    ],
)
def test_host_ranges(tmp_path: Path, pattern: str, expected: list[str]) -> None:
    ini = write(tmp_path, "hosts.ini", f"[gpu]\n{pattern}\n")
    yml = write(tmp_path, "hosts.yml", f"gpu:\n  hosts:\n    {pattern}:\n")
    assert list(load_inventory(ini).hosts) == expected
    assert list(load_inventory(yml).hosts) == expected


def test_host_range_with_port_and_vars(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "[gpu]\ngpu[1:2]:2222 rack=a\n")
    hosts = load_inventory(path).hosts
    assert [(h.name, h.port, h.vars["rack"]) for h in hosts.values()] == [
        ("gpu1", 2222, "a"),
        ("gpu2", 2222, "a"),
    ]


# Connection settings -------------------------------------------------------------------------


def test_ports(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", """
        [nodes]
        plain
        colon:2201
        both:2201 ansible_port=2202
        quoted ansible_port="2203"
        [override]
        colon
        [override:vars]
        ansible_port=2299
    """)
    write(tmp_path, "host_vars/both.yml", "ansible_port: '2204'\n")
    hosts = load_inventory(path).hosts
    assert [hosts[name].port for name in ("plain", "colon", "both", "quoted")] == [
        22, 2201, 2204, 2203,
    ]  # fmt: skip
    assert hosts["colon"].vars["ansible_port"] == 2201


def test_ipv6_hosts(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "[v6]\nfd00::10\n[fd00::11]:2222\n")
    hosts = load_inventory(path).hosts
    assert [(h.name, h.address, h.port) for h in hosts.values()] == [
        ("fd00::10", "fd00::10", 22),
        ("fd00::11", "fd00::11", 2222),
    ]


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("", "ssh"),
        ("ansible_connection=ssh", "ssh"),
        ("ansible_connection=paramiko", "ssh"),
        ("ansible_connection=smart", "ssh"),
        ("ansible_connection=local", "local"),
        ("ansible_connection=ansible.builtin.local", "local"),
    ],
)
def test_connection_types(tmp_path: Path, setting: str, expected: str) -> None:
    path = write(tmp_path, "hosts.ini", f"localhost {setting}\n")
    assert load_inventory(path).hosts["localhost"].connection == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("True", True), ("yes", True), ("'TRUE'", True), ("1", True), ("no", False), ("0", False),
     ("false", False)],
)  # fmt: skip
def test_become_accepts_ansible_booleans(tmp_path: Path, value: str, expected: bool) -> None:
    path = write(tmp_path, "hosts.ini", f"node1 ansible_become={value} ansible_become_user=svc\n")
    host = load_inventory(path).hosts["node1"]
    assert (host.become, host.become_user) == (expected, "svc")


def test_user_key_and_ssh_args(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", """
        all:
          hosts:
            a:
              ansible_user: ubuntu
              ansible_private_key_file: /keys/a
              ansible_ssh_common_args: -o ServerAliveInterval=30
              ansible_ssh_extra_args: "-o 'ProxyCommand=ssh -W %h:%p jump'"
            b:
              ansible_ssh_private_key_file: /keys/ssh
              ansible_private_key_file: /keys/generic
    """)
    hosts = load_inventory(path).hosts
    assert hosts["a"].user == "ubuntu"
    assert hosts["a"].private_key_file == "/keys/a"
    assert hosts["a"].ssh_common_args == [
        "-o", "ServerAliveInterval=30", "-o", "ProxyCommand=ssh -W %h:%p jump",
    ]  # fmt: skip
    assert (hosts["b"].user, hosts["b"].private_key_file) == (None, "/keys/ssh")


def test_legacy_connection_variable_names(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "old ansible_ssh_host=10.0.0.7 ansible_ssh_port=2200 "
                 "ansible_ssh_user=admin\n")  # fmt: skip
    host = load_inventory(path).hosts["old"]
    assert (host.address, host.port, host.user) == ("10.0.0.7", 2200, "admin")


def test_host_properties_report_bad_values() -> None:
    host = Host("n1", {"ansible_port": "ssh"}, frozenset({"all"}))
    with pytest.raises(InventoryError) as caught:
        _ = host.port
    assert str(caught.value) == (
        "host 'n1': invalid ansible_port 'ssh': expected a number from 1 to 65535"
    )


# Patterns ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Inventory:
    path = write(tmp_path_factory.mktemp("patterns"), "hosts.ini", """
        jump
        [h200]
        gpu[01:04]
        [h100]
        node0[1:2]
        [rack_a]
        gpu[01:02]
        node01
        [gpu:children]
        h200
        h100
    """)
    return load_inventory(path)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (None, "jump gpu01 gpu02 node01 gpu03 gpu04 node02"),
        ("all", "jump gpu01 gpu02 node01 gpu03 gpu04 node02"),
        ("*", "jump gpu01 gpu02 node01 gpu03 gpu04 node02"),
        ("al*", "jump gpu01 gpu02 node01 gpu03 gpu04 node02"),
        ("gpu03", "gpu03"),
        ("h100", "node01 node02"),
        ("ungrouped", "jump"),
        ("gpu0*", "gpu01 gpu02 gpu03 gpu04"),
        ("node0?", "node01 node02"),
        ("h*", "gpu01 gpu02 gpu03 gpu04 node01 node02"),
        ("h1*", "node01 node02"),
        ("~gpu0[13]", "gpu01 gpu03"),
        ("~(jump|node02)", "jump node02"),
        ("gpu04:jump", "gpu04 jump"),
        ("gpu04,jump", "gpu04 jump"),
        ("gpu:&rack_a", "gpu01 gpu02 node01"),
        ("gpu:!rack_a", "gpu03 gpu04 node02"),
        ("!rack_a:h200", "gpu03 gpu04"),
        ("&h100:rack_a:!gpu01", "node01"),
        ("&rack_a:!gpu01", "gpu02 node01"),
        ("h200, h100 :&rack_a:!node*", "gpu01 gpu02 gpu03 gpu04"),
        ("gpu[0]", "gpu01"),
        ("gpu[1:2]", "gpu02 gpu03"),
        ("gpu[2:]", "gpu03 gpu04 node01 node02"),
        ("gpu[-1]", "node02"),
        ("gpu[3:0]", "gpu04"),
        ("rack_a[0:1]:h100[1]", "gpu01 gpu02 node02"),
        ("gpu[1-2]", "gpu02 gpu03"),
        ("gpu[9:]", ""),
        ("nothing*", ""),
    ],
)
def test_patterns(cluster: Inventory, pattern: str | None, expected: str) -> None:
    assert names(cluster, pattern) == expected.split()


@pytest.mark.parametrize(
    ("pattern", "term"),
    [("gpu05", "gpu05"), ("gpu:!rack_c", "rack_c"), ("all:&h300", "h300"),
     ("h200:&rack_a,h100", "h200:&rack_a")],
)
def test_pattern_term_matching_nothing(cluster: Inventory, pattern: str, term: str) -> None:
    with pytest.raises(InventoryError) as caught:
        cluster.select(pattern)
    assert str(caught.value) == f"host pattern term '{term}' matches no host or group"


def test_pattern_index_outside_the_group(cluster: Inventory) -> None:
    with pytest.raises(InventoryError) as caught:
        cluster.select("gpu[9]")
    assert str(caught.value) == "host pattern 'gpu[9]': index 9 is outside the 6 host(s) matched"


def test_pattern_with_a_bad_regular_expression(cluster: Inventory) -> None:
    with pytest.raises(InventoryError) as caught:
        cluster.select("~gpu(")
    assert str(caught.value) == (
        "host pattern term '~gpu(' is not a valid expression: "
        "missing ), unterminated subpattern at position 3"
    )


# Digest --------------------------------------------------------------------------------------


def test_digest_is_stable_and_location_independent(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(ATLAS, copy)
    first = load_inventory(ATLAS).digest()
    assert len(first) == 64
    assert load_inventory(ATLAS).digest() == first
    assert load_inventory(copy).digest() == first


def test_digest_follows_every_source(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(ATLAS, copy)
    before = load_inventory(copy).digest()
    (copy / "README.md").write_text("edited docs do not matter\n")
    assert load_inventory(copy).digest() == before
    nccl = copy / "group_vars" / "h200" / "nccl.yml"
    nccl.write_text(nccl.read_text() + "nccl_debug: INFO\n")
    changed = load_inventory(copy).digest()
    assert changed != before
    nccl.rename(nccl.with_name("zz-nccl.yml"))
    assert load_inventory(copy).digest() not in (before, changed)


# Errors --------------------------------------------------------------------------------------


def test_error_yaml_syntax(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", """
        all:
          hosts:
            gpu01:
              ansible_host: [10.0.0.1
    """)
    assert load_error(path) == (
        f"{path}:5: invalid YAML: expected ',' or ']', but got '<stream end>'"
    )


def test_error_ini_unterminated_section(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "[gpu]\ngpu01\n[login\nlogin01\n")
    assert load_error(path) == f"{path}:3: invalid section header '[login'"
    path = write(tmp_path, "spaced.ini", "[gpu]\ngpu01\n[log in]\n")
    assert load_error(path) == (f"{path}:3: invalid section header '[log in]' (no spaces or "
                                "other characters allowed in a section name)")


def test_error_ini_unknown_section_type(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "[gpu:host]\ngpu01\n")
    assert load_error(path) == (
        f"{path}:1: unknown section type 'host' in '[gpu:host]' (expected hosts, children or vars)"
    )


def test_error_ini_host_var_without_value(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "[gpu]\ngpu01 ansible_host=10.0.0.1 rack\n")
    assert load_error(path) == f"{path}:2: expected key=value after host 'gpu01', got 'rack'"


def test_error_ini_group_var_without_value(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "[gpu]\ngpu01\n[gpu:vars]\ndriver 560\n")
    assert load_error(path) == f"{path}:4: expected key=value in [gpu:vars], got 'driver 560'"


def test_error_ini_unclosed_quote(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "gpu01 motd='hello\n")
    assert load_error(path) == f"{path}:1: cannot parse host line: No closing quotation"


def test_error_undefined_child_group(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", """
        [h200]
        gpu01
        [gpu:children]
        h200
        h300
    """)
    assert load_error(path) == f"{path}:5: section [gpu:children] names undefined group 'h300'"


def test_error_vars_for_undefined_group(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "[gpu]\ngpu01\n[gpus:vars]\ndriver=560\n")
    assert load_error(path) == f"{path}:3: section [gpus:vars] names undefined group 'gpus'"


def test_child_group_defined_in_an_earlier_file(tmp_path: Path) -> None:
    write(tmp_path, "inv/a.yml", "h200:\n  hosts:\n    gpu01:\n")
    write(tmp_path, "inv/b.ini", "[gpu:children]\nh200\n")
    assert load_inventory(tmp_path / "inv").groups["gpu"] == {"gpu01"}


def test_child_group_defined_only_in_a_later_file(tmp_path: Path) -> None:
    # Ansible checks an INI file's :children references at the end of that file.
    write(tmp_path, "inv/a.ini", "[gpu:children]\nh200\n")
    write(tmp_path, "inv/b.yml", "h200:\n  hosts:\n    gpu01:\n")
    assert load_error(tmp_path / "inv") == (
        f"{tmp_path / 'inv' / 'a.ini'}:2: section [gpu:children] names undefined group 'h200'")


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("gpu[16:01]", "start 16 is after end 01"),
        ("node-[f:a]", "start f is after end a"),
        ("gpu[a:09]", "start and end must be two numbers or two letters of the same case"),
        ("gpu[a:Z]", "start and end must be two numbers or two letters of the same case"),
        ("gpu[01:16:0]", "step must be a positive integer, got '0'"),
        ("gpu[01:16:x]", "step must be a positive integer, got 'x'"),
        ("gpu[01:100]", "zero-padded start and end must have the same width"),
        ("gpu[01:]", "end is missing"),
        ("gpu[0116]", "expected [start:end] or [start:end:step]"),
    ],
)
def test_error_impossible_range(tmp_path: Path, pattern: str, reason: str) -> None:
    path = write(tmp_path, "hosts.ini", f"[gpu]\n{pattern}\n")
    assert load_error(path) == f"{path}:2: invalid host range '{pattern}': {reason}"


def test_error_impossible_range_in_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", "gpu:\n  hosts:\n    gpu01:\n    gpu[16:01]:\n")
    assert load_error(path) == (
        f"{path}:4: invalid host range 'gpu[16:01]': start 16 is after end 01"
    )


def test_error_port_not_a_number_inline(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "[gpu]\ngpu01 ansible_port=abc\n")
    assert load_error(path) == (
        f"{path}:2: invalid ansible_port 'abc': expected a number from 1 to 65535"
    )


def test_error_port_not_a_number_after_colon(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", "gpu:\n  hosts:\n    gpu01:abc:\n")
    assert load_error(path) == (
        f"{path}:3: invalid port 'abc' in host 'gpu01:abc': expected a number from 1 to 65535"
    )


def test_error_host_with_two_ports(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "[gpu]\ngpu01:22:2222\n")
    assert load_error(path) == (
        f"{path}:2: invalid host 'gpu01:22:2222': expected name, name:port or IPv6 address"
    )


def test_error_port_out_of_range_in_group_vars_file(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "[gpu]\ngpu01\n")
    gv = write(tmp_path, "group_vars/gpu.yml", "driver: '560'\nansible_port: 70000\n")
    assert load_error(path) == (
        f"{gv}:2: invalid ansible_port 70000: expected a number from 1 to 65535"
    )


def test_error_unknown_connection(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", """
        gpu:
          vars:
            ansible_user: ops
            ansible_connection: docker
          hosts:
            gpu01:
    """)
    assert load_error(path) == (
        f"{path}:4: invalid ansible_connection 'docker': "
        "unknown connection type (supported: ssh, local)"
    )


def test_error_become_not_a_boolean(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "[gpu]\ngpu01\n[gpu:vars]\nansible_become=sometimes\n")
    assert load_error(path) == (
        f"{path}:4: invalid ansible_become 'sometimes': "
        "expected a boolean (yes/no, true/false or 1/0)"
    )


def test_error_group_priority_not_an_integer(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", "gpu:\n  vars:\n    ansible_group_priority: high\n")
    assert load_error(path) == (
        f"{path}:3: invalid ansible_group_priority 'high': expected an integer"
    )


def test_error_children_cycle(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", """
        [a:children]
        b
        [b:children]
        a
        [c:children]
        a
    """)
    assert load_error(path) == f"{path}:4: group children form a cycle: a -> b -> a"


def test_error_yaml_cycle_through_all(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", "gpu:\n  children:\n    all:\n")
    assert load_error(path) == f"{path}:3: group 'all' cannot be a child of group 'gpu'"


def test_error_host_defined_twice_with_different_addresses(tmp_path: Path) -> None:
    first = write(tmp_path, "inv/a.ini", "[gpu]\ngpu01 ansible_host=10.0.0.1\n")
    second = write(tmp_path, "inv/b.yml", """
        rack_a:
          hosts:
            gpu02:
            gpu01:
              ansible_host: 10.0.0.2
    """)
    assert load_error(tmp_path / "inv") == (
        f"{second}:4: host 'gpu01' defined twice with different addresses: "
        f"10.0.0.2 here, 10.0.0.1 at {first}:2"
    )


def test_error_host_defined_twice_with_different_ports(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "[gpu]\ngpu01:2201\n[rack]\ngpu01 ansible_port=2202\n")
    assert load_error(path) == (
        f"{path}:4: host 'gpu01' defined twice with different addresses: "
        f"port 2202 here, port 2201 at {path}:2"
    )


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("gpu:\n  hosts:\n    - gpu01\n", 2,
         "'hosts' of group 'gpu' must be a mapping, got a list"),
        ("gpu:\n  children: [h200]\n", 2,
         "'children' of group 'gpu' must be a mapping, got a list"),
        ("gpu:\n  vars: [driver]\n", 2, "'vars' of group 'gpu' must be a mapping, got a list"),
        ("gpu:\n  - gpu01\n", 1,
         "group 'gpu' must be a mapping of hosts, children and vars, got a list"),
        ("gpu:\n  hostz:\n    gpu01:\n", 2,
         "unexpected key 'hostz' in group 'gpu' (expected hosts, children or vars)"),
        ("gpu:\n  hosts:\n    gpu01: 10.0.0.1\n", 3,
         "vars of host 'gpu01' must be a mapping, got a string"),
        ("gpu:\n  hosts:\n    gpu01:\n      1: one\n", 4,
         "variable names must be strings, got int 1"),
        ("gpu:\n  hosts:\n    42:\n", 3, "host names must be strings, got int 42"),
        ("all:\n  children:\n    gpu:\n      hosts:\n        gpu01:\n    7: {}\n", 6,
         "group names must be strings, got int 7"),
    ],
)  # fmt: skip
def test_error_yaml_structure(tmp_path: Path, text: str, line: int, problem: str) -> None:
    path = write(tmp_path, "hosts.yml", text)
    assert load_error(path) == f"{path}:{line}: {problem}"


def test_error_yaml_inventory_not_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", "- gpu01\n- gpu02\n")
    assert load_error(path) == f"{path}: a YAML inventory must be a mapping of groups, got a list"


def test_error_host_vars_file_not_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "gpu01\n")
    hv = write(tmp_path, "host_vars/gpu01.yml", "- ansible_host: 10.0.0.1\n")
    assert load_error(path) == f"{hv}: a variables file must be a mapping, got a list"


def test_error_vault_encrypted_vars_file(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "gpu01\n")
    vault = write(tmp_path, "group_vars/all/vault.yml", "$ANSIBLE_VAULT;1.1;AES256\n6162636465\n")
    assert load_error(path) == (f"{vault}: encrypted with ansible-vault; gpufleet cannot decrypt "
                                "vault; pass `ansible-inventory --list` JSON instead")


def test_error_vault_encrypted_value(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "gpu01\n")
    secrets = write(tmp_path, "group_vars/all.yml", """
        ansible_become_password: !vault |
          $ANSIBLE_VAULT;1.1;AES256
          6162636465
    """)
    assert load_error(path) == (
        f"vault-encrypted value in {secrets}:1 (variable ansible_become_password): gpufleet "
        "cannot decrypt vault; pass `ansible-inventory --list` JSON instead"
    )


def test_error_inventory_script(tmp_path: Path) -> None:
    path = write(tmp_path, "inventory", "#!/usr/bin/env python3\nprint('{}')\n")
    assert load_error(path) == (
        f"{path}: inventory scripts are not supported; use a static YAML or INI file, or the "
        "output of `ansible-inventory --list`"
    )


def test_error_empty_directory(tmp_path: Path) -> None:
    write(tmp_path, "inv/README.md", "nothing here\n")
    assert load_error(tmp_path / "inv") == f"{tmp_path / 'inv'}: no inventory files found"


def test_error_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "hosts.ini"
    path.write_bytes(b"[gpu]\ngpu01 motd=caf\xe9\n")
    assert load_error(path) == f"{path}:2: not UTF-8 text"
