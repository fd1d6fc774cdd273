"""Templates in inventory values: what Ansible users commonly write is rendered with the
host's variables; anything else fails with host, variable and place, and only when read."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpufleet.errors import InventoryError
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host
from gpufleet.inventory.secrets import redact
from gpufleet.inventory.templating import TemplateError


def host_of(tmp_path: Path, variables: str, name: str = "n1") -> tuple[Host, Path]:
    path = tmp_path / "hosts.yml"
    body = textwrap.indent(textwrap.dedent(variables).strip("\n"), " " * 6)
    path.write_text(f"all:\n  hosts:\n    {name}:\n{body}\n")
    return load_inventory(path).hosts[name], path


def error_of(host: Host, key: str) -> str:
    with pytest.raises(TemplateError) as caught:
        host.vars.get(key)
    return str(caught.value)


def test_references_and_filters_render_with_native_types(tmp_path: Path) -> None:
    host, _ = host_of(tmp_path, """
        site: Atlas
        user_base: ops
        ansible_user: "{{ user_base }}"
        ansible_host: "10.0.0.{{ index }}"
        index: 7
        ansible_port: "{{ base_port | int + 22 }}"
        base_port: "2200"
        servers: [a, b]
        line: "{{ servers | join(',') | upper }}"
        flag: "{{ 'yes' | bool }}"
        label: "{{ '  x ' | trim | replace('x', site | lower) }}"
        as_string: "{{ index | string }}"
        fallback: "{{ nothing | default('none') }}"
        short: "{{ inventory_hostname_short }}-{{ inventory_hostname }}"
        nested: {url: "https://{{ site | lower }}/", list: ["{{ index }}", 2]}
    """, name="n1.example.net")
    assert (host.user, host.address, host.port) == ("ops", "10.0.0.7", 2222)
    assert host.vars["line"] == "A,B"
    assert host.vars["flag"] is True
    assert host.vars["label"] == "atlas"
    assert host.vars["as_string"] == "7"
    assert host.vars["fallback"] == "none"
    assert host.vars["short"] == "n1-n1.example.net"
    assert host.vars["nested"] == {"url": "https://atlas/", "list": [7, 2]}


def test_raw_blocks_and_unsafe_values_are_never_templated(tmp_path: Path) -> None:
    host, _ = host_of(tmp_path, """
        raw: "{% raw %}{{ kept }}{% endraw %}"
        unsafe: !unsafe "{{ kept }}"
        output: "{{ '{{ not again }}' }}"
    """)
    assert (host.vars["raw"], host.vars["unsafe"], host.vars["output"]) == (
        "{{ kept }}", "{{ kept }}", "{{ not again }}")


@pytest.mark.parametrize(("template", "problem"), [
    ("{{ lookup('env', 'USER') }}", "uses lookup(), and gpufleet does not run Ansible "
     "lookups (write the value itself in the inventory)"),
    ("{{ query('inventory_hostnames', 'all') }}", "uses query(), and gpufleet does not run "
     "Ansible lookups (write the value itself in the inventory)"),
    ("{{ q('x') }}", "uses q(), and gpufleet does not run Ansible lookups (write the value "
     "itself in the inventory)"),
    ("{{ range(3) }}", "calls range(), which gpufleet does not provide"),
    ("{{ vars['x'] }}", "refers to the vars dictionary, which gpufleet does not template "
     "(write the value itself in the inventory)"),
    ("{{ x | to_nice_yaml }}", "uses the filter 'to_nice_yaml', which gpufleet does not "
     "provide (it renders bool, d, default, int, join, lower, replace, string, trim, upper)"),
    ("{{ undefined_var }}", "'undefined_var' is undefined"),
    ("{{ x ", "invalid template (unexpected end of template, expected 'end of print "
     "statement'.)"),
    ("{{ ''.__class__.__mro__ }}", "refused by the sandbox"),
    ("{{ 'a' * 100000000 }}", "renders to more than 1048576 characters"),
    ("{{ 9 ** 99999999 }}", "computes a number too large to use"),
    ("{{ 1 / 0 }}", "cannot be rendered (ZeroDivisionError: division by zero)"),
])
def test_what_gpufleet_does_not_render_names_host_variable_and_line(
        tmp_path: Path, template: str, problem: str) -> None:
    host, path = host_of(tmp_path, f"ansible_user: ops\nbad: {template!r}\n")
    message = error_of(host, "bad")
    assert message.startswith(f"host 'n1': variable 'bad' ({path}:5) {problem}")
    assert message.endswith(repr(template)) or "sandbox" in message


def test_a_bad_template_fails_only_when_read(tmp_path: Path) -> None:
    host, _ = host_of(tmp_path, """
        ansible_user: ops
        unused_by_gpufleet: "{{ lookup('hashi_vault', 'secret=x') }}"
    """)
    assert host.user == "ops"


def test_a_bad_template_in_a_connection_setting_fails_that_host(tmp_path: Path) -> None:
    host, path = host_of(tmp_path, 'ansible_user: "{{ lookup(\'env\', \'USER\') }}"\n')
    with pytest.raises(InventoryError) as caught:
        host.user  # noqa: B018 - reading the property renders the template
    assert str(caught.value).startswith(f"host 'n1': variable 'ansible_user' ({path}:4) uses "
                                        "lookup()")


def test_a_rendered_connection_setting_is_still_validated(tmp_path: Path) -> None:
    host, path = host_of(tmp_path, 'ansible_port: "{{ 70000 }}"\n')
    with pytest.raises(InventoryError) as caught:
        host.port  # noqa: B018 - reading the property renders and checks the template
    assert str(caught.value) == (f"host 'n1' ({path}:4): invalid ansible_port 70000: "
                                 "expected a number from 1 to 65535")


def test_cycles_are_reported_with_their_path(tmp_path: Path) -> None:
    host, path = host_of(tmp_path, """
        a: "{{ b }}"
        b: "{{ c }}-x"
        c: "{{ a }}"
    """)
    assert error_of(host, "a") == (f"host 'n1': variable 'a' ({path}:4) refers to itself: "
                                   "a -> b -> c -> a (needed by a -> b -> c)")


def test_an_error_in_a_referenced_variable_names_both(tmp_path: Path) -> None:
    host, path = host_of(tmp_path, """
        outer: "x{{ inner }}"
        inner: "{{ nope }}"
    """)
    assert error_of(host, "outer") == (f"host 'n1': variable 'inner' ({path}:5) 'nope' is "
                                       "undefined: '{{ nope }}' (needed by outer)")


def test_the_place_is_where_the_winning_value_is_set(tmp_path: Path) -> None:
    inventory_file = tmp_path / "hosts.ini"
    inventory_file.write_text("[gpu]\nn1\n[gpu:vars]\nx=1\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "n1.yml").write_text("a: 1\nx: '{{ y }}'\n")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("z: '{{ lookup(\"x\") }}'\n")
    host = load_inventory(inventory_file).hosts["n1"]
    assert error_of(host, "x").startswith(
        f"host 'n1': variable 'x' ({tmp_path / 'host_vars' / 'n1.yml'}:2) 'y' is undefined")
    assert error_of(host, "z").startswith(
        f"host 'n1': variable 'z' ({tmp_path / 'group_vars' / 'all.yml'}:1) uses lookup()")


def test_a_long_reference_chain_is_bounded(tmp_path: Path) -> None:
    chain = "".join(f'v{n}: "{{{{ v{n + 1} }}}}"\n' for n in range(100)) + "v100: end\n"
    host, _ = host_of(tmp_path, chain)
    assert "references nest more than 40 deep" in error_of(host, "v0")
    assert host.vars["v70"] == "end"


def test_doubling_through_references_is_bounded_and_fast(tmp_path: Path) -> None:
    chain = "".join(f'v{n}: "{{{{ v{n + 1} ~ v{n + 1} }}}}"\n' for n in range(30))
    host, _ = host_of(tmp_path, chain + "v30: " + "x" * 64 + "\n")
    start = time.monotonic()
    assert "renders to more than 1048576 characters" in error_of(host, "v0")
    assert time.monotonic() - start < 2


def test_changing_a_variable_renders_its_users_again(tmp_path: Path) -> None:
    host, _ = host_of(tmp_path, 'greeting: "hello {{ who }}"\nwho: world\n')
    assert host.vars["greeting"] == "hello world"
    host.vars["who"] = "lab"
    assert host.vars["greeting"] == "hello lab"


def test_many_threads_read_one_hosts_templates(tmp_path: Path) -> None:
    chain = "".join(f'v{n}: "{{{{ v{n + 1} }}}}-{n}"\n' for n in range(30)) + "v30: end\n"
    host, _ = host_of(tmp_path, chain)
    start = threading.Barrier(16)

    def read(_: int) -> str:
        start.wait()
        return str(host.vars["v0"])

    with ThreadPoolExecutor(16) as pool:
        results = set(pool.map(read, range(16)))
    assert results == {"end-" + "-".join(str(n) for n in range(29, -1, -1))}


def test_a_rendered_secret_is_redacted_too(tmp_path: Path) -> None:
    host, _ = host_of(tmp_path, 'base: "hunter"\nansible_become_password: "{{ base }}-2024!"\n')
    assert host.vars["ansible_become_password"] == "hunter-2024!"
    assert redact("line with hunter-2024! in it") == "line with ******** in it"


def test_host_variables_copy_deeply(tmp_path: Path) -> None:
    host, _ = host_of(tmp_path, 'servers: [a, b]\nline: "{{ servers | join(\',\') }}"\n')
    copied = copy.deepcopy(host.vars)
    copied["servers"].append("c")
    assert (host.vars["line"], copied["line"]) == ("a,b", "a,b,c")


# Bounded work and allocation: refused before it happens --------------------------------------

BIG = "big: \"{{ 'a' * 1000000 }}\"\nsmall: \"{{ 'x' * 30000 }}\"\n"
TOO_LARGE = "renders to more than 1048576 characters"
BOUND_CASES = [
    ("{% for a in big %}{% for b in big %}{% endfor %}{% endfor %}",
     "loops more than 100000 times"),
    ("{% for a in 'ab' %}{% for b in 'ab' %}{% for c in 'ab' %}{% for d in 'ab' %}{{ d }}"
     "{% endfor %}{% endfor %}{% endfor %}{% endfor %}", "nests loops more than 3 deep"),
    ("{% for a in 'ab' recursive %}{{ loop(a) }}{% endfor %}",
     "calls loop(), which gpufleet does not provide"),
    ("{{ 'a'.ljust(10000000000) }}", "calls str.ljust(), which gpufleet does not render"),
    ("{{ 'a'.center(10000000000) }}", "calls str.center(), which gpufleet does not render"),
    ("{{ '1'.zfill(10000000000) }}", "calls str.zfill(), which gpufleet does not render"),
    ("{{ '{:>10000000000}'.format(1) }}", "calls format(), which gpufleet does not render"),
    ("{{ '%010000000000d' % 1 }}", TOO_LARGE),
    ("{{ '%s%s' % (big, big) }}", TOO_LARGE),
    ("{{ big | replace('a', big) }}", TOO_LARGE),
    ("{{ big.replace('a', 'aa') }}", TOO_LARGE),
    ("{{ big | replace('', 'x') }}", TOO_LARGE),
    ("{{ big ~ big }}", TOO_LARGE),
    ("{{ big + big }}", TOO_LARGE),
    ("{{ [big, big] | join(big) }}", TOO_LARGE),
    ("{% for c in small %}{{ big.replace('a', 'b')[0] }}{% endfor %}",
     "takes more than 2s to render"),
]


@pytest.mark.parametrize(("template", "problem"), BOUND_CASES,
                         ids=[f"case{i}" for i in range(len(BOUND_CASES))])
def test_unbounded_work_is_refused_before_it_runs(tmp_path: Path, template: str,
                                                  problem: str) -> None:
    host, path = host_of(tmp_path, BIG + f"bomb: {json.dumps(template)}\n")
    start = time.process_time()
    message = error_of(host, "bomb")
    assert time.process_time() - start < 3.0
    assert message.startswith(f"host 'n1': variable 'bomb' ({path}:6) {problem}: ")


def test_refusals_allocate_nothing_like_their_result(tmp_path: Path) -> None:
    """In a process of its own, every case above is refused with the process's peak memory
    far below a single refused result (10 GB for the ljust case). The peak is VmHWM, the
    process's own: getrusage's maxrss keeps the forking parent's across exec, and a long
    pytest run is itself over 300 MB."""
    body = "".join(f"    b{i}: {json.dumps(t)}\n" for i, (t, _) in enumerate(BOUND_CASES[:-1]))
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    n1:\n" + textwrap.indent(BIG, " " * 6)
                    + textwrap.indent(body, "  "))
    code = (
        "import sys\n"
        "from gpufleet.inventory.load import load_inventory\n"
        "from gpufleet.inventory.templating import TemplateError\n"
        "host = load_inventory(sys.argv[1]).hosts['n1']\n"
        f"for i in range({len(BOUND_CASES) - 1}):\n"
        "    try:\n"
        "        host.vars[f'b{i}']\n"
        "    except TemplateError:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit(f'b{i} was rendered')\n"
        "print(next(int(line.split()[1]) for line in open('/proc/self/status')\n"
        "           if line.startswith('VmHWM:')))\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 300 * 1024  # KiB: under 300 MB


def test_loops_and_methods_inventories_use_still_render(tmp_path: Path) -> None:
    host, _ = host_of(tmp_path, """
        servers: [a, b, c]
        line: "{% for s in servers %}{{ s | upper }}{% if not loop.last %},{% endif %}{% endfor %}"
        pairs: "{% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}={{ v }};{% endfor %}"
        parts: "{{ 'a.b.c'.split('.') | join('-') }}"
        cased: "{{ 'Atlas'.lower() ~ '-' ~ 'x'.upper() }}"
        padded: "{{ '%-6s|' % 'ab' }}"
    """)
    assert host.vars["line"] == "A,B,C"
    assert host.vars["pairs"] == "x=1;y=2;"
    assert host.vars["parts"] == "a-b-c"
    assert host.vars["cased"] == "atlas-X"
    assert host.vars["padded"] == "ab    |"


def test_a_cycle_through_another_hosts_variables_is_an_error_not_a_hang(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    n1:\n      x: \"{{ hostvars['n2'].y }}\"\n"
                    "    n2:\n      y: \"{{ hostvars['n1'].x }}\"\n")
    message = error_of(load_inventory(path).hosts["n1"], "x")
    assert message.startswith(f"host 'n1': variable 'x' ({path}:4) ")
    assert "refers to itself: x -> x" in message


@pytest.mark.timeout(60)
def test_hosts_reading_each_others_variables_from_two_threads_do_not_deadlock(
        tmp_path: Path) -> None:
    """n1 renders n2's variable while n2 renders n1's: one lock per inventory, not per host."""
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    n1:\n      a: 1\n      x: \"{{ hostvars['n2'].b + 1 }}\"\n"
                    "    n2:\n      b: 2\n      y: \"{{ hostvars['n1'].a + 1 }}\"\n")
    for _ in range(200):
        hosts = load_inventory(path).hosts
        with ThreadPoolExecutor(2) as pool:
            found = list(pool.map(lambda host, key: host.vars[key],
                                  [hosts["n1"], hosts["n2"]], ["x", "y"]))
        assert found == [3, 2]


def test_a_variable_that_is_groups_is_the_hosts_own_copy(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text("gpu:\n  hosts:\n    n1:\n      g: '{{ groups }}'\n    n2:\n"
                    "      h: \"{{ groups['gpu'] | join(',') }}\"\n")
    inventory = load_inventory(path)
    inventory.hosts["n1"].vars["g"]["gpu"].append("intruder")
    assert inventory.hosts["n2"].vars["h"] == "n1,n2"
