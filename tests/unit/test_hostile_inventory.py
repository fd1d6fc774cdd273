"""Hostile and broken inventories: each fails fast with one clear line, or reads as Ansible
reads it."""

from __future__ import annotations

import json
import os
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.errors import InventoryError
from gpufleet.inventory.load import load_inventory, resolve_inventory
from gpufleet.inventory.model import Inventory

FAST_S = 2.0


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def fails_fast(load: Callable[[], object]) -> str:
    """The InventoryError a load raises, asserting it came quickly: in CPU time, which a
    busy machine does not inflate as it does wall time."""
    start = time.process_time()
    with pytest.raises(InventoryError) as caught:
        load()
    assert time.process_time() - start < FAST_S
    return str(caught.value)


# Denial of service ----------------------------------------------------------------------------


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    levels = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 10)]
    path = write(tmp_path, "hosts.yml", "all:\n  vars:\n" + "".join(
        f"    {line}\n" for line in levels))
    message = fails_fast(lambda: load_inventory(path))
    assert message == (f"{path}:9: more than 2000000 values once its aliases are expanded "
                       "(GPUFLEET_MAX_INVENTORY_NODES)")


def test_anchors_and_merge_keys_within_the_bound_still_work(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", """
        all:
          vars:
            base: &base {mtu: 9000, ifname: ib0}
            copy: *base
            merged: {<<: *base, mtu: 4200}
          hosts:
            n1:
    """)
    variables = load_inventory(path).hosts["n1"].vars
    assert (variables["copy"], variables["merged"]) == (
        {"mtu": 9000, "ifname": "ib0"}, {"mtu": 4200, "ifname": "ib0"})


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", "all:\n  vars:\n    loop: &loop [*loop]\n")
    assert fails_fast(lambda: load_inventory(path)) == (
        f"{path}:3: an alias refers to a node that contains it")


def test_a_fifo_as_inventory_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "hosts"
    os.mkfifo(fifo)
    assert fails_fast(lambda: load_inventory(fifo)) == (
        f"{fifo}: a FIFO, not an inventory file; refusing to read it")


def test_a_fifo_as_group_vars_is_refused_without_waiting(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", "[gpu]\ngpu01\n")
    (tmp_path / "group_vars").mkdir()
    os.mkfifo(tmp_path / "group_vars" / "gpu.yml")
    assert fails_fast(lambda: load_inventory(path)) == (
        f"{tmp_path / 'group_vars' / 'gpu.yml'}: a FIFO, not an inventory file; refusing to "
        "read it")


def test_a_device_as_inventory_is_refused() -> None:
    assert fails_fast(lambda: load_inventory("/dev/zero")) == (
        "/dev/zero: a device, not an inventory file; refusing to read it")


@pytest.mark.parametrize("entry", ["n[0:999999999999]", "n[0:99999]-[0:9]", "n[a:z][0:9999]"])
def test_a_huge_host_range_is_refused_before_it_is_built(tmp_path: Path, entry: str) -> None:
    ini = write(tmp_path, "hosts.ini", f"[gpu]\n{entry}\n")
    message = fails_fast(lambda: load_inventory(ini))
    assert message.startswith(f"{ini}:2: host range '{entry}' stands for ")
    assert message.endswith(" hosts, more than the limit of 100000 (GPUFLEET_MAX_HOSTS)")
    yml = write(tmp_path, "hosts.yml", f"gpu:\n  hosts:\n    {entry}:\n")
    assert fails_fast(lambda: load_inventory(yml)).startswith(f"{yml}:3: host range ")


def test_the_host_limit_counts_every_entry_and_is_configurable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "hosts.ini", "[a]\na[1:6]\n[b]\nb[1:6]\n")
    monkeypatch.setenv("GPUFLEET_MAX_HOSTS", "10")
    assert fails_fast(lambda: load_inventory(path)) == (
        f"{path}:4: more than 10 hosts (GPUFLEET_MAX_HOSTS)")
    monkeypatch.setenv("GPUFLEET_MAX_HOSTS", "12")
    assert len(load_inventory(path).hosts) == 12
    monkeypatch.setenv("GPUFLEET_MAX_HOSTS", "lots")
    assert fails_fast(lambda: load_inventory(path)) == (
        "environment variable GPUFLEET_MAX_HOSTS must be a positive integer, got 'lots'")


def test_deeply_nested_yaml_is_refused_without_a_recursion_error(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", "all:\n  vars:\n    deep: " + "[" * 5000 + "]" * 5000)
    assert fails_fast(lambda: load_inventory(path)) == (
        f"{path}:3: nested more than 64 levels deep (GPUFLEET_MAX_INVENTORY_DEPTH)")


def test_nesting_through_aliases_counts_too(tmp_path: Path) -> None:
    inner = "[" * 40 + "]" * 40
    outer = "[" * 30 + "*inner" + "]" * 30
    path = write(tmp_path, "hosts.yml", f"all:\n  vars:\n    a: &inner {inner}\n    b: {outer}\n")
    assert "nested more than 64 levels deep once its aliases are expanded" in fails_fast(
        lambda: load_inventory(path))


def test_deeply_nested_groups_are_refused(tmp_path: Path) -> None:
    text = "".join(f"{'  ' * (2 * n)}g{n}:\n{'  ' * (2 * n + 1)}children:\n" for n in range(40))
    path = write(tmp_path, "hosts.yml", text)
    assert "nested more than 64 levels deep" in fails_fast(lambda: load_inventory(path))


def test_a_long_chain_of_ini_children_loads_without_recursion(tmp_path: Path) -> None:
    chain = "".join(f"[g{n}:children]\ng{n + 1}\n" for n in range(3000))
    path = write(tmp_path, "hosts.ini", chain + "[g3000]\nleaf\n")
    start = time.process_time()
    inventory = load_inventory(path)
    assert time.process_time() - start < 10
    assert inventory.hosts["leaf"].groups >= {"g0", "g1500", "g3000"}
    assert inventory.select("g0") == [inventory.hosts["leaf"]]


def test_a_long_ini_children_cycle_is_reported_not_recursed(tmp_path: Path) -> None:
    chain = "".join(f"[g{n}:children]\ng{(n + 1) % 2000}\n" for n in range(2000))
    path = write(tmp_path, "hosts.ini", chain)
    message = fails_fast(lambda: load_inventory(path))
    assert message.startswith(f"{path}:") and "group children form a cycle: g0 -> g1 -> " in message


@pytest.mark.timeout(30)
@pytest.mark.parametrize("where", [".", "group_vars/gpu"])
def test_a_symbolic_link_loop_is_refused_naming_the_link(tmp_path: Path, where: str) -> None:
    """Two links to ``.`` made the directory walk branch twice at every level, forever."""
    write(tmp_path, "hosts.yml", "gpu:\n  hosts:\n    gpu01:\n")
    write(tmp_path, "group_vars/gpu/main.yml", "x: 1\n")
    os.symlink(".", tmp_path / where / "a")
    os.symlink(".", tmp_path / where / "b")
    message = fails_fast(lambda: load_inventory(tmp_path))
    assert message == (f"{tmp_path / where / 'a'}: a symbolic link loop: this directory is "
                       "one it is inside; remove the link")


def test_a_directory_linked_twice_without_a_loop_is_read(tmp_path: Path) -> None:
    write(tmp_path, "site/hosts.yml", "gpu:\n  hosts:\n    gpu01:\n")
    os.symlink("site", tmp_path / "mirror")
    assert list(load_inventory(tmp_path).hosts) == ["gpu01"]


def test_a_huge_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    with path.open("wb") as handle:
        handle.truncate(60 * 1024 * 1024)
    assert fails_fast(lambda: load_inventory(path)) == (
        f"{path}: {60 * 1024 * 1024} bytes, more than the limit of {16 * 1024 * 1024} "
        "(GPUFLEET_MAX_INVENTORY_BYTES)")


def test_the_size_limit_is_configurable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "hosts.ini", "[gpu]\n" + "".join(f"gpu{n:04d}\n" for n in range(500)))
    monkeypatch.setenv("GPUFLEET_MAX_INVENTORY_BYTES", "1000")
    assert fails_fast(lambda: load_inventory(path)) == (
        f"{path}: 4006 bytes, more than the limit of 1000 (GPUFLEET_MAX_INVENTORY_BYTES)")
    monkeypatch.setenv("GPUFLEET_MAX_INVENTORY_BYTES", "5000")
    assert len(load_inventory(path).hosts) == 500


def test_deeply_nested_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "listing.json"
    path.write_text('{"_meta": {"hostvars": {"n1": {"x": ' + "[" * 100000 + "]" * 100000
                    + "}}}}")
    assert fails_fast(lambda: load_inventory(path)) == (
        f"{path}: nested more than 64 levels deep (GPUFLEET_MAX_INVENTORY_DEPTH)")


# Paths ----------------------------------------------------------------------------------------


def test_an_explicit_path_loads_that_file_not_the_yml_beside_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "inventory/x/hosts", "[gpu]\nfrom-hosts\n")
    write(tmp_path, "inventory/x/hosts.yml", "all:\n  hosts:\n    from-hosts-yml:\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_inventory("x/hosts") == Path("inventory/x/hosts")
    assert list(load_inventory("x/hosts").hosts) == ["from-hosts"]
    assert list(load_inventory("inventory/x/hosts").hosts) == ["from-hosts"]
    assert list(load_inventory(tmp_path / "inventory/x/hosts").hosts) == ["from-hosts"]
    assert list(load_inventory("x/hosts.yml").hosts) == ["from-hosts-yml"]


@pytest.mark.parametrize(("name", "shown"), [("prod\nstaging", "line break"),
                                             ("prod\0", "NUL byte")])
def test_an_inventory_path_with_a_line_break_or_nul(name: str, shown: str) -> None:
    assert fails_fast(lambda: load_inventory(name)) == f"inventory {name!r} contains a {shown}"


@pytest.mark.parametrize("key", ["gpufleet_known_hosts", "ansible_ssh_private_key_file",
                                 "ansible_private_key_file"])
def test_paths_with_line_breaks_are_refused_at_their_line(tmp_path: Path, key: str) -> None:
    path = write(tmp_path, "hosts.yml", f'all:\n  hosts:\n    n1:\n      {key}: "a\\nb"\n')
    assert fails_fast(lambda: load_inventory(path)) == (
        f"{path}:4: invalid {key} 'a\\nb': the path 'a\\nb' contains a line break")


def test_known_hosts_files_with_line_breaks_in_ssh_args(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini",
                 "n1 ansible_ssh_common_args='-o \"UserKnownHostsFile=/tmp/a\0b\"'\n")
    assert "contains a NUL byte" in fails_fast(lambda: load_inventory(path))


@pytest.mark.parametrize(("value", "reason"), [
    ("-J ops@bastion:notaport", "expected a number from 1 to 65535"),
    ("-J ops@bastion:70000", "expected a number from 1 to 65535"),
    ("-o ProxyJump=a,b", "multi-hop ProxyJump is not supported (one [user@]host[:port] only)"),
    ("-J @bastion", "empty user before '@'"),
    ("-J 'ops@bad host'", "expected [user@]host[:port]"),
    ("-J", None),
])
def test_bad_proxy_jumps_are_refused_at_their_line(tmp_path: Path, value: str,
                                                   reason: str | None) -> None:
    path = write(tmp_path, "hosts.yml", f'all:\n  vars:\n    ansible_ssh_common_args: "{value}"\n'
                 "  hosts:\n    n1:\n")
    if reason is None:
        assert load_inventory(path).hosts["n1"].ssh_common_args == ["-J"]
        return
    jump = value.split(" ", 1)[1].replace("'", "").removeprefix("ProxyJump=")
    assert fails_fast(lambda: load_inventory(path)) == (
        f"{path}:3: invalid ansible_ssh_common_args {value!r}: ProxyJump '{jump}': {reason}")


# Vault and ansible-inventory JSON ------------------------------------------------------------


def test_an_inline_vault_value_names_file_line_and_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", """
        all:
          hosts:
            gpu01:
              ansible_user: ops
              ansible_become_password: !vault |
                $ANSIBLE_VAULT;1.1;AES256
                3633
    """)
    assert fails_fast(lambda: load_inventory(path)) == (
        f"vault-encrypted value in {path}:5 (variable ansible_become_password): gpufleet "
        "cannot decrypt vault; pass `ansible-inventory --list` JSON instead")


def test_a_vault_value_inside_a_structure(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", """
        all:
          vars:
            credentials:
              - user: ops
                token: !vault |
                  $ANSIBLE_VAULT;1.1;AES256
                  3633
    """)
    assert fails_fast(lambda: load_inventory(path)) == (
        f"vault-encrypted value in {path}:5 (variable credentials): gpufleet cannot decrypt "
        "vault; pass `ansible-inventory --list` JSON instead")


def listing(tmp_path: Path, document: object, name: str = "listing.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def test_an_ansible_inventory_listing_is_read_as_is(tmp_path: Path) -> None:
    path = listing(tmp_path, {
        "_meta": {"hostvars": {"gpu01": {"ansible_host": "10.0.0.1", "ansible_port": 2222,
                                         "secret_word": {"__ansible_unsafe": "{{ no }}"}}}},
        "all": {"children": ["ungrouped", "gpu"]},
        "gpu": {"hosts": ["gpu01", "gpu02"], "vars": {"driver": "560"}},
    })
    write(tmp_path, "group_vars/gpu.yml", "driver: not-read-beside-a-listing\n")
    inventory = load_inventory(path)
    gpu01 = inventory.hosts["gpu01"]
    assert (gpu01.address, gpu01.port) == ("10.0.0.1", 2222)
    assert dict(gpu01.vars) == {"driver": "560", "ansible_host": "10.0.0.1",
                                "ansible_port": 2222, "secret_word": "{{ no }}"}
    assert inventory.group_hosts("gpu") == ["gpu01", "gpu02"]
    assert gpu01.origin("ansible_host") == str(path)


def test_a_listing_with_an_inline_vault_value(tmp_path: Path) -> None:
    # ansible-inventory --list keeps inline !vault values encrypted, password or not.
    path = listing(tmp_path, {"_meta": {"hostvars": {"gpu01": {
        "ansible_become_password": {"__ansible_vault": "$ANSIBLE_VAULT;1.1;AES256\n3633"}}}}})
    assert fails_fast(lambda: load_inventory(path)) == (
        f"vault-encrypted value in {path} (variable ansible_become_password): ansible-inventory "
        "keeps inline !vault values encrypted; keep the secret in a file encrypted with "
        "ansible-vault, which ansible-inventory --list decrypts")


def test_a_listing_with_a_bad_port_is_refused(tmp_path: Path) -> None:
    path = listing(tmp_path, {"_meta": {"hostvars": {"gpu01": {"ansible_port": 0}}}})
    assert fails_fast(lambda: load_inventory(path)) == (
        f"{path}: invalid ansible_port 0: expected a number from 1 to 65535")


def test_a_static_json_inventory_is_still_yaml_style(tmp_path: Path) -> None:
    path = listing(tmp_path, {"gpu": {"hosts": {"gpu01": {"ansible_port": 2201}}}}, "hosts.json")
    inventory: Inventory = load_inventory(path)
    assert inventory.hosts["gpu01"].port == 2201


def test_legacy_ssh_variables_win_as_they_do_for_ansibles_ssh_connection(
        tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.ini", """
        [gpu]
        gpu01 ansible_host=10.0.0.1 ansible_ssh_host=10.0.0.2 ansible_port=22 ansible_ssh_port=2202 ansible_user=a ansible_ssh_user=b
        gpu02 ansible_password=p1 ansible_ssh_pass=p2
        gpu03 ansible_password=p1 ansible_ssh_pass=p2 ansible_ssh_password=p3
        [gpu:vars]
        ansible_ssh_user=group-level
    """)  # noqa: E501
    write(tmp_path, "host_vars/gpu02.yml", "ansible_user: host-level\n")
    hosts = load_inventory(path).hosts
    assert (hosts["gpu01"].address, hosts["gpu01"].port, hosts["gpu01"].user) == (
        "10.0.0.2", 2202, "b")
    assert hosts["gpu02"].user == "group-level"
    assert (hosts["gpu02"].password, hosts["gpu03"].password) == ("p2", "p3")


LISTINGS = Path(__file__).parent.parent / "fixtures" / "inventories" / "real-world" / "oracle"


def test_a_real_listing_of_a_vault_encrypted_file_is_read(tmp_path: Path) -> None:
    # `ansible-inventory --list --vault-password-file ...` over group_vars/all/vault.yml
    # encrypted with ansible-vault: the values come out decrypted.
    host = load_inventory(LISTINGS / "listing-vault-file.json").hosts["n1"]
    assert host.vars["vault_pw"] == "s3cret"


def test_a_real_listing_with_an_inline_vault_value_is_refused() -> None:
    # The same command over an inline !vault value: it stays encrypted in the listing, and
    # the template beside it stays a template.
    path = LISTINGS / "listing-inline-vault.json"
    assert fails_fast(lambda: load_inventory(path)).startswith(
        f"vault-encrypted value in {path} (variable ansible_become_password): "
        "ansible-inventory keeps inline !vault values encrypted")


@pytest.mark.parametrize(("name", "text", "line"), [
    ("hosts.yml", "all:\n  hosts:\n    a\x00b:\n", 3),
    ("hosts.ini", "[gpu]\ngpu01\ngpu\x0002\n", 3),
    ("listing.json", '{"_meta": {"hostvars": {}}, "all": {"hosts": ["a\x00"]}}', 1),
    ("group_vars/all.yml", "x: 1\ny: \"a\x00b\"\n", 2),
])
def test_a_nul_byte_in_any_inventory_file_names_the_file_and_line(
        tmp_path: Path, name: str, text: str, line: int) -> None:
    (tmp_path / "group_vars").mkdir()
    if name.startswith("group_vars"):
        write(tmp_path, "hosts.yml", "all:\n  hosts:\n    a:\n")
    (tmp_path / name).write_text(text)
    source = tmp_path if name.startswith("group_vars") else tmp_path / name
    assert fails_fast(lambda: load_inventory(source)) == \
        f"{tmp_path / name}:{line}: contains a NUL byte"


def test_a_character_yaml_forbids_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yml", "all:\n  vars:\n    x: \"a\x01b\"\n")
    assert fails_fast(lambda: load_inventory(path)) == \
        f"{path}:3: invalid YAML: special characters are not allowed"
