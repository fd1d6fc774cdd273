"""How inventories are loaded and shown fast: libyaml's events build what the pure-Python
loader builds, hosts share group values without seeing each other's changes, hosts of the
same groups share the renders that nothing of their own reaches, templates that are only
text and variables render as Jinja renders them, redaction skips the patterns that cannot
match and remembers what it made of short texts, and the listing is written as json.dumps
writes it."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import InventoryError
from gpufleet.inventory import listing, read_yaml, secrets, templating
from gpufleet.inventory.files import Where, limits
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.inventory.read_yaml import Mapping, Vaulted, parse_yaml
from gpufleet.inventory.templating import HostVars

needs_libyaml = pytest.mark.skipif(not read_yaml._LIBYAML, reason="PyYAML without libyaml")

DOCUMENTS = {
    "scalars": "a: 0x1F\nb: 0o17\nc: 017\nd: 1_000\ne: 1:30\nf: .nan\ng: -.inf\nh: 1e3\n"
               "i: yes\nj: Off\nk: ~\nl: null\nm:\nn: 2024-01-02\no: 2024-01-02T03:04:05Z\n"
               "p: '1'\nq: \"x\\ty\"\nr: +12\ns: -0.0\nt: 0b101\n",
    "block scalars": "a: |\n  line1\n  line2\nb: >\n  folded\n  text\nc: plain\n  continued\n",
    "flow": "all: {hosts: {n1: {x: [1, 2, {y: z}]}, n2: }, vars: {a: b}}\n",
    "duplicate keys": "a: 1\nb: 2\na: 3\n",
    "scalar keys": "1: a\ntrue: b\n~: c\n2024-01-01: d\n'q': e\n? simple\n: v\n",
    "complex key": "? [a, b]\n: c\n",
    "merge key": "base: &b {x: 1}\nm: {<<: *b, y: 2}\n",
    "alias": "a: &x hi\nb: *x\nc: [*x, *x]\n",
    "tags": "a: !!str 1\nb: !unsafe '{{ x }}'\nc: !vault |\n  $ANSIBLE_VAULT\nd: !!int '5'\n",
    "non-specific tag": "a: ! 12\nb: ! {x: 1}\n",
    "set": "s: !!set {a, b}\n",
    "value key": "=: x\n",
    "two documents": "a: 1\n---\nb: 2\n",
    "empty": "",
    "comments only": "# only\n# comments\n",
    "document markers": "%YAML 1.1\n---\na: 1\n...\n",
    "empty document": "---\n...\n",
    "scalar document": "just text\n",
    "list document": "- a\n- b\n",
    "unicode": "é: \"ü\\u2028x\"\nkey: \"\\U0001F600\"\n",
    "indentless sequences": "a:\n- 1\n- 2\nb:\n  - x\n",
    "empty collections": "a: {}\nb: []\nc: {x: {}}\n",
    "crlf": "a: 1\r\nb:\r\n  c: 2\r\n",
    "unclosed flow": "a: [1, 2\n",
    "mapping in a scalar": "a: b: c\n",
    "tab": "a:\n\tb: 1\n",
    "invalid date": "a: 2023-02-30\n",
    "forbidden character": "a: \"x\x01y\"\n",
    "undefined alias": "a: *nope\n",
    "deep flow": "a: " + "[" * 70 + "]" * 70 + "\n",
    "deep block": "".join("  " * i + f"k{i}:\n" for i in range(70)),
}


def _read(text: str) -> tuple[str, Any]:
    try:
        return "ok", parse_yaml(text, Where(Path("hosts.yml")), limits())
    except InventoryError as exc:
        return "error", str(exc)


def _same(ours: Any, theirs: Any) -> bool:
    """Equal values of the same types, with the same lines where YAML mappings record them."""
    if type(ours) is not type(theirs):
        return False
    if isinstance(ours, dict):
        lines = (ours.line, ours.key_lines) == (theirs.line, theirs.key_lines) \
            if isinstance(ours, Mapping) else True
        return lines and list(ours) == list(theirs) and all(_same(ours[k], theirs[k])
                                                            for k in ours)
    if isinstance(ours, list):
        return len(ours) == len(theirs) and all(map(_same, ours, theirs))
    if isinstance(ours, Vaulted):
        return bool(ours.line == theirs.line)
    return repr(ours) == repr(theirs) if isinstance(ours, float) else bool(ours == theirs)


@needs_libyaml
@pytest.mark.parametrize("text", DOCUMENTS.values(), ids=DOCUMENTS.keys())
def test_libyaml_reads_every_document_as_the_pure_python_loader(
        text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = _read(text)
    monkeypatch.setattr(read_yaml, "_LIBYAML", False)
    theirs = _read(text)
    assert ours[0] == theirs[0]
    assert _same(ours[1], theirs[1]) if ours[0] == "ok" else ours == theirs


@needs_libyaml
def test_a_plain_inventory_is_built_from_the_parser_events(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def composed(*args: object) -> None:
        raise AssertionError("composed")

    monkeypatch.setattr(read_yaml, "_composed", composed)
    text = "all:\n  children:\n    h200:\n      hosts:\n        gpu01: {ansible_host: 10.0.0.1}\n"
    document = parse_yaml(text, Where(Path("hosts.yml")), limits())
    assert document == {"all": {"children": {"h200": {"hosts": {
        "gpu01": {"ansible_host": "10.0.0.1"}}}}}}
    host = document["all"]["children"]["h200"]["hosts"]
    assert (host.line, host.key_lines) == (5, {"gpu01": 5})


# Hosts share group values, never each other's changes ---------------------------------------


def _inventory(tmp_path: Path) -> Inventory:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu.yml").write_text(
        "nccl_env: {NCCL_DEBUG: WARN}\nservers: [a, b]\nline: \"{{ servers | join(',') }}\"\n"
        "name: \"{{ inventory_hostname }}\"\nplain: \"{{ 'group' }}\"\n")
    (tmp_path / "hosts.yml").write_text(
        "gpu:\n  hosts:\n    n[1:3]:\n      nested: {list: [1, 2]}\n"
        "    n4:\n      plain: host\n      own: \"{{ plain }}!\"\n")
    return load_inventory(tmp_path)


def test_a_host_changing_a_shared_value_changes_only_its_own(tmp_path: Path) -> None:
    hosts = _inventory(tmp_path).hosts
    hosts["n1"].vars["nccl_env"]["NCCL_DEBUG"] = "INFO"
    hosts["n1"].vars["servers"].append("c")
    hosts["n1"].vars["nested"]["list"].append(3)
    hosts["n1"].vars["other"] = "set"  # forgets what was rendered, not what was changed
    assert hosts["n1"].vars["nccl_env"] == {"NCCL_DEBUG": "INFO"}
    assert (hosts["n1"].vars["servers"], hosts["n1"].vars["line"]) == (["a", "b", "c"], "a,b,c")
    assert hosts["n1"].vars["nested"] == {"list": [1, 2, 3]}
    for name in ("n2", "n3", "n4"):
        assert hosts[name].vars["nccl_env"] == {"NCCL_DEBUG": "WARN"}
        assert (hosts[name].vars["servers"], hosts[name].vars["line"]) == (["a", "b"], "a,b")
    assert hosts["n2"].vars["nested"] == hosts["n3"].vars["nested"] == {"list": [1, 2]}
    raw = hosts["n2"].vars.raw()  # type: ignore[attr-defined]
    raw["servers"].append("z")
    assert hosts["n2"].vars["servers"] == ["a", "b"]


def test_templates_are_rendered_where_the_winning_value_is_one(tmp_path: Path) -> None:
    hosts = _inventory(tmp_path).hosts
    assert [hosts[n].vars["name"] for n in ("n1", "n4")] == ["n1", "n4"]
    assert (hosts["n1"].vars["plain"], hosts["n4"].vars["plain"]) == ("group", "host")
    assert hosts["n4"].vars["own"] == "host!"
    hosts["n4"].vars["plain"] = "{{ 'set' }}"
    assert (hosts["n4"].vars["plain"], hosts["n4"].vars["own"]) == ("set", "set!")
    del hosts["n4"].vars["plain"]
    assert "plain" not in hosts["n4"].vars


def test_host_vars_are_found_from_one_listing_of_the_directory(tmp_path: Path) -> None:
    host_vars = tmp_path / "host_vars"
    (host_vars / "gpu02").mkdir(parents=True)
    (host_vars / "gpu01.yml").write_text("found: yml\n")
    (host_vars / "gpu02" / "main.yml").write_text("found: directory\n")
    (host_vars / "gpu03").write_text("found: no extension\n")
    (host_vars / "gpu04.yml").symlink_to(tmp_path / "nowhere")
    (host_vars / "gpu04.yaml").write_text("found: yaml after a dangling link\n")
    (host_vars / "nœud.json").write_text('{"found": "json"}\n')
    (tmp_path / "hosts.ini").write_text("gpu0[1:5]\nnœud\n")
    hosts = load_inventory(tmp_path).hosts
    assert {name: host.vars.get("found") for name, host in hosts.items()} == {
        "gpu01": "yml", "gpu02": "directory", "gpu03": "no extension",
        "gpu04": "yaml after a dangling link", "gpu05": None, "nœud": "json"}


# Hosts of the same groups share a render that nothing of their own reaches -------------------


def _rack(tmp_path: Path) -> Inventory:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text(
        'site: atlas\ndomain: "{{ site }}.example.net"\n'
        'fqdn: "{{ inventory_hostname }}.{{ domain }}"\nleaf: "leaf{{ rack }}.{{ domain }}"\n'
        'ifname: bond0\nenv: {NCCL_SOCKET_IFNAME: "{{ ifname }}"}\nservers: [a, b]\n'
        "line: \"{{ servers | join(',') }}\"\nbroken: \"{{ nowhere }}\"\n")
    (tmp_path / "hosts.yml").write_text(
        "rack1:\n  vars: {rack: 1}\n  hosts:\n    n1:\n    n2:\n    n3: {ifname: eth0}\n"
        "    n4: {site: dc2}\n")
    return load_inventory(tmp_path)


def test_hosts_share_a_render_that_nothing_of_their_own_reaches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rendered: list[str] = []
    render = HostVars._render_text

    def counted(self: HostVars, text: str) -> Any:
        rendered.append(text)
        return render(self, text)

    monkeypatch.setattr(HostVars, "_render_text", counted)
    hosts = _rack(tmp_path).hosts
    keys = ("domain", "fqdn", "leaf", "env", "line")
    got = {name: {key: host.vars[key] for key in keys} for name, host in hosts.items()}
    first = {"domain": "atlas.example.net", "fqdn": "n1.atlas.example.net",
             "leaf": "leaf1.atlas.example.net", "env": {"NCCL_SOCKET_IFNAME": "bond0"},
             "line": "a,b"}
    assert got == {
        "n1": first, "n2": {**first, "fqdn": "n2.atlas.example.net"},
        "n3": {**first, "fqdn": "n3.atlas.example.net", "env": {"NCCL_SOCKET_IFNAME": "eth0"}},
        "n4": {**first, "domain": "dc2.example.net", "fqdn": "n4.dc2.example.net",
               "leaf": "leaf1.dc2.example.net"}}
    assert {text: rendered.count(text) for text in set(rendered)} == {
        "{{ site }}.example.net": 2,  # n1's for n1 to n3, n4's own (its site)
        "{{ inventory_hostname }}.{{ domain }}": 4, "leaf{{ rack }}.{{ domain }}": 2,
        "{{ ifname }}": 2, "{{ servers | join(',') }}": 1}
    assert hosts["n1"].vars["env"] is not hosts["n2"].vars["env"]


def test_a_host_changing_what_a_template_reaches_renders_it_alone(tmp_path: Path) -> None:
    hosts = _rack(tmp_path).hosts
    assert hosts["n1"].vars["line"] == "a,b"
    hosts["n2"].vars["servers"].append("c")  # changed in place, not set
    assert (hosts["n2"].vars["line"], hosts["n3"].vars["line"]) == ("a,b,c", "a,b")
    hosts["n1"].vars["env"]["NCCL_SOCKET_IFNAME"] = "changed"
    assert hosts["n2"].vars["env"] == {"NCCL_SOCKET_IFNAME": "bond0"}
    hosts["n2"].vars["ifname"] = "eth9"
    assert hosts["n2"].vars["env"] == {"NCCL_SOCKET_IFNAME": "eth9"}
    assert hosts["n4"].vars["env"] == {"NCCL_SOCKET_IFNAME": "bond0"}
    for name in ("n1", "n2"):  # a render that fails is each host's own failure
        with pytest.raises(InventoryError, match=f"^host '{name}': variable 'broken' "):
            hosts[name].vars["broken"]


class _Recorded(dict[str, Any]):
    """A scope that has every name and records the ones a render looks up."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __contains__(self, key: object) -> bool:
        self.seen.add(str(key))
        return True

    def __getitem__(self, key: str) -> Any:
        self.seen.add(key)
        return {"items": [1, 2], "a": {"b": 1}, "d": {"x": 2}, "e": "x"}.get(key, "v")


@pytest.mark.parametrize("text", [
    "{{ y }}{% set y = 1 %}{{ y }}", "{% for i in items %}{{ y }}{% set y = 2 %}{% endfor %}",
    "{% with a = b %}{{ a }}{{ c }}{% endwith %}", "{{ a.b }}{{ d[e] }}",
    "{% if x is defined %}{{ x }}{% else %}{{ z | default(w) }}{% endif %}",
    "{% filter upper %}{{ f }}{% endfilter %}", "{{ loop }}{{ self }}{{ (a ~ b) | lower }}",
    "{% for k in items recursive %}{{ loop.index }}{{ k }}{% endfor %}{{ k }}",
])
def test_a_template_looks_up_only_the_names_it_is_known_to_reach(text: str) -> None:
    compiled = templating._compiled(text)
    scope = _Recorded()
    context = compiled.template.new_context(scope, shared=True)
    "".join(map(str, compiled.template.root_render_func(context)))
    assert scope.seen <= compiled.names


# Templates of text and variables only, rendered without a Jinja context ----------------------

TEXT_AND_VARIABLES = [
    "{{ name }}", "{{ count }}", "{{ servers }}", "{{ env }}", "{{ flag }}", "{{ nothing }}",
    "{{ inventory_hostname }}.{{ domain }}", "{{ inventory_hostname_short }}-{{ count }}",
    "x{{ servers }}", "{{ name }}{{ name }}{{ count }}", "{# note #}{{ count }}",
    "{{ count }}{# note #} ", "{{- name -}} ", "{% raw %}{{ name }}{% endraw %}", "text{# #}",
    "{{ missing }}", "{{ name }}{{ missing }}", "{{ big }}{{ big }}", "{{ loop_a }}",
    "{{ bad }}",
]
VARIABLES = {"name": "gpu", "count": 3, "servers": ["a", "b"], "env": {"K": "v"}, "flag": True,
             "nothing": None, "domain": "{{ name }}.example.net", "big": "x" * 600000,
             "loop_a": "{{ loop_b }}", "loop_b": "{{ loop_a }}", "bad": "{{ name | nope }}"}


def _rendered(text: str) -> tuple[str, Any]:
    host = HostVars("gpu01.example.net", {**VARIABLES, "under_test": text}, {}, None)
    try:
        return "ok", host["under_test"]
    except InventoryError as exc:
        return "error", str(exc)


@pytest.mark.parametrize("text", TEXT_AND_VARIABLES)
def test_text_and_variables_render_as_jinja_renders_them(
        text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = _rendered(text)
    templating._compiled.cache_clear()
    monkeypatch.setattr(templating._Compiled, "_pieces", lambda self: None)
    theirs = _rendered(text)
    templating._compiled.cache_clear()
    assert ours == theirs
    assert type(ours[1]) is type(theirs[1])


def test_text_and_variables_are_rendered_without_jinja() -> None:
    direct = templating._compiled("{{ inventory_hostname }}.{{ domain }}").direct
    assert direct is not None
    names, pieces = direct
    assert names == ("inventory_hostname", "domain")
    assert [piece if type(piece) is str else piece.name for piece in pieces] == [
        "inventory_hostname", ".", "domain"]
    assert templating._compiled("{{ name | lower }}").direct is None
    assert templating._compiled("{{ self }}").direct is None


# Redaction skips the patterns when none can match -------------------------------------------

REDACTED = [
    "DB_PASS=hunter2", "PASSPHRASE = open sesame", "GITHUB_PAT=ghp_abcdef", "Pat=1",
    "\u017fecret: x",
    "index-url = https://user:tok3n@pypi.example/simple", "remote https://ghp@github.com/x",
    "machine pypi.example login user password p4ss", "tool --token=tok -v", "-----BEGIN ",
    "-----BEGIN RSA PRIVATE KEY-----\nabc\n-----END RSA PRIVATE KEY-----", "a\nkey: v\ntoken: t",
    "AUTHORIZATION: Basic abc", "Authorization=x", "path=/opt/pat/pass bypass_cache=1",
    "NCCL_DEBUG=WARN", "gpu01.atlas.example.net", "10.0.0.1", "", "ssh://h", "x://y@z",
    "paßword=1", "PASSWORD\u212a", "token", "pass", "my pass word",
]


@pytest.mark.parametrize("text", REDACTED)
def test_redaction_is_what_every_pattern_gives(text: str) -> None:
    expected = secrets._PRIVATE_KEY.sub(secrets._masked_block, text)
    for pattern in (secrets._KEY_VALUE, secrets._OPTION, secrets._SPACED,
                    secrets._AUTHORIZATION, secrets._URL_CREDENTIALS):
        expected = pattern.sub(secrets._masked, expected)
    for secret in sorted(secrets.known_secrets(), key=len, reverse=True):
        expected = expected.replace(secret, secrets.MASK)
    assert secrets.redact(text) == expected


def test_a_secret_remembered_later_is_redacted_too() -> None:
    text = "x s3cr3t-later y"
    assert secrets.redact(text) == secrets.redact(text) == text  # not a secret yet
    secrets.remember_secret("later_password", "s3cr3t-later")
    assert secrets.redact(text) == f"x {secrets.MASK} y"


# The listing's JSON is json.dumps(indent=4, default=str) ---------------------------------------

JSON_DOCUMENTS: list[Any] = [
    {}, [], "text", 1, -2.5, True, None, float("nan"), float("inf"), float("-inf"),
    {"a": {}, "b": [], "c": [{}], "d": [[[]]], "e": {"f": {"g": [1, "x", None, False]}}},
    {1: "int", 2.5: "float", None: "none", "é\u2028\"\\": "ü\U0001F600\n\t"},
    {True: "yes", False: "no", float("nan"): "nan"},
    {"date": datetime.date(2024, 1, 2), "unsafe": read_yaml.Unsafe("{{ x }}"), "t": (1, 2)},
    [Mapping(3), {"k": Mapping(4)}, 10**30, 1e300, -0.0, 0.1],
]


@pytest.mark.parametrize("document", JSON_DOCUMENTS)
def test_the_listing_is_written_as_json_dumps_writes_it(document: Any) -> None:
    assert listing.dumps(document) == json.dumps(document, indent=4, default=str)


def test_a_key_json_cannot_write_is_refused_as_json_refuses_it() -> None:
    with pytest.raises(TypeError, match=r"^keys must be str, int, float, bool or None, not tuple$"):
        listing.dumps({(1, 2): "x"})
    with pytest.raises(TypeError, match=r"^keys must be str, int, float, bool or None, not tuple$"):
        json.dumps({(1, 2): "x"}, indent=4, default=str)
