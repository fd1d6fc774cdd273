"""Variables as an inventory sets them: ``Vars``, the values one place sets with the line of
each; variables read from YAML (a vault-encrypted value refused where it is); and the
connection settings among them (``ansible_port``, ``ansible_connection``, ssh arguments,
paths), each checked at the line that sets it."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.errors import InventoryError
from gpufleet.inventory.files import Limits, Where, check_path_text, read_text
from gpufleet.inventory.hosts import parse_port
from gpufleet.inventory.read_yaml import Mapping as YamlMapping
from gpufleet.inventory.read_yaml import Vaulted, parse_yaml
from gpufleet.inventory.templating import is_template

_SSH_ALIASES = frozenset({"ssh", "paramiko", "paramiko_ssh", "smart"})

_TRUE = frozenset({"yes", "true", "1"})

_FALSE = frozenset({"no", "false", "0"})

VAULT_HINT = "gpufleet cannot decrypt vault; pass `ansible-inventory --list` JSON instead"

_PATH_KEYS = ("gpufleet_known_hosts", "ansible_ssh_private_key_file", "ansible_private_key_file")


def parse_connection(value: Any) -> str:
    """``ssh`` or ``local`` for an ansible_connection value (paramiko and smart are ssh)."""
    name = str(value).removeprefix("ansible.builtin.")
    if name == "local":
        return "local"
    if name in _SSH_ALIASES:
        return "ssh"
    raise ValueError("unknown connection type (supported: ssh, local)")


def parse_bool(value: Any) -> bool:
    """A boolean as Ansible writes it (yes/no, true/false, 1/0)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError("expected a boolean (yes/no, true/false or 1/0)")


def parse_path(value: Any) -> str:
    """A path, refused when its text cannot name a file."""
    text = str(value)
    try:
        check_path_text(text, "the path")
    except InventoryError as exc:
        raise ValueError(str(exc)) from None
    return text


def ssh_option(args: list[str], name: str) -> str | None:
    """The value of ``-o Name=value`` (or ``-J value`` for ProxyJump) in ssh arguments."""
    key = name.lower() + "="
    for index, arg in enumerate(args):
        candidate = args[index + 1] if arg == "-o" and index + 1 < len(args) else arg
        candidate = candidate[2:] if candidate.startswith("-o") else candidate
        if candidate.lower().startswith(key):
            return candidate.split("=", 1)[1]
        if name == "ProxyJump" and arg == "-J" and index + 1 < len(args):
            return args[index + 1]
        if name == "ProxyJump" and arg.startswith("-J") and len(arg) > 2:
            return arg[2:]
    return None


def parse_jump(value: str) -> tuple[str | None, str, int] | None:
    """A ProxyJump value as (user, host, port); None for ``none``. One hop only."""
    if value.lower() == "none":
        return None
    if "," in value:
        raise ValueError("multi-hop ProxyJump is not supported (one [user@]host[:port] only)")
    text = value.removeprefix("ssh://")
    user, at, rest = text.rpartition("@")
    if at and not user:
        raise ValueError("empty user before '@'")
    if rest.startswith("["):
        address, _, port_text = rest[1:].partition("]")
        port_text = port_text.removeprefix(":")
    else:
        address, _, port_text = rest.partition(":")
    if not address or any(char.isspace() or char in "/'\"`$;&|<>" for char in address):
        raise ValueError("expected [user@]host[:port]")
    port = parse_port(port_text) if port_text else 22
    return (user or None), address, port


def parse_args(value: Any) -> list[str]:
    """Extra ssh arguments split as a shell would; a ProxyJump and known hosts files in
    them are checked."""
    try:
        args = shlex.split(str(value))
    except ValueError as exc:
        raise ValueError(f"cannot split into arguments: {exc}") from None
    jump = ssh_option(args, "ProxyJump")
    if jump is not None:
        try:
            parse_jump(jump)
        except ValueError as exc:
            raise ValueError(f"ProxyJump '{jump}': {exc}") from None
    known = ssh_option(args, "UserKnownHostsFile")
    if known is not None:
        for path in known.split():
            parse_path(path)
    return args


_CHECKS: dict[str, Callable[[Any], object]] = {
    "ansible_port": parse_port,
    "ansible_ssh_port": parse_port,
    "ansible_connection": parse_connection,
    "ansible_become": parse_bool,
    "ansible_ssh_common_args": parse_args,
    "ansible_ssh_extra_args": parse_args,
    **{key: parse_path for key in _PATH_KEYS},
}


def invalid_setting(key: str, value: Any, reason: object) -> str:
    """The one message of a setting that cannot be used."""
    return f"invalid {key} {value!r}: {reason}"


def type_name(value: Any) -> str:
    """What a YAML value is, for an error message."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return type(value).__name__


@dataclass
class Vars:
    """Variables set in one place, with the line each one is set on where known."""

    values: dict[str, Any]
    where: Where
    lines: Mapping[str, int] = field(default_factory=dict)

    def where_of(self, key: str) -> Where:
        return self.where.at(self.lines.get(key, self.where.line))

    def origins(self) -> dict[str, str]:
        """``str(self.where_of(key))`` of every key."""
        file, default, lines = str(self.where.file), self.where.line, self.lines
        return {key: f"{file}:{line}" if (line := lines.get(key, default)) else file
                for key in self.values}

    def check(self) -> None:
        """Reject connection settings gpufleet cannot use, at the line that sets them (a
        template is checked once rendered, when the host's setting is read)."""
        for key, value in self.values.items():
            check = _CHECKS.get(key)
            if check is None or value is None or is_template(value):
                continue
            try:
                check(value)
            except ValueError as exc:
                raise self.where_of(key).error(invalid_setting(key, value, exc)) from None


def _vault_error(where: Where, key: str | None) -> InventoryError:
    variable = f" (variable {key})" if key else ""
    return InventoryError(f"vault-encrypted value in {where}{variable}: {VAULT_HINT}")


_LEAVES = frozenset({str, int, float, bool, type(None)})


def _checked(value: Any, where: Where, key: str) -> Any:
    """``plain(value)``, refusing a vault-encrypted value in it (at that value's line)."""
    if isinstance(value, Vaulted):
        raise _vault_error(where.at(value.line), key)
    if isinstance(value, dict):
        return {name: item if type(item) in _LEAVES else _checked(item, where, key)
                for name, item in value.items()}
    if isinstance(value, list):
        return [item if type(item) in _LEAVES else _checked(item, where, key)
                for item in value]
    return value


def yaml_entries(value: Any, where: Where, what: str) -> list[tuple[Any, Any, Where]]:
    """The (key, value, place of key) entries of a YAML mapping that may be null."""
    if value is None:
        return []
    if isinstance(value, Vaulted):
        raise _vault_error(where.at(value.line), None)
    if not isinstance(value, YamlMapping):
        raise where.error(f"{what} must be a mapping, got {type_name(value)}")
    return [(key, item, where.at(value.key_lines[key])) for key, item in value.items()]


def yaml_vars(value: Any, where: Where, what: str) -> Vars:
    """Variables from a YAML mapping (None is none), names checked and no vault value in them."""
    if not isinstance(value, YamlMapping):
        yaml_entries(value, where, what)  # None is no variables; anything else is refused
        return Vars({}, where, {})
    values: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            at = where.at(value.key_lines[key])
            raise at.error(f"variable names must be strings, got {type_name(key)} {key!r}")
        if isinstance(item, (dict, list, Vaulted)):
            values[key] = _checked(item, where, key)
        else:
            values[key] = item
    return Vars(values, where, value.key_lines)


def load_vars_file(file: Path, bounds: Limits) -> Vars:
    """The variables of one group_vars/ or host_vars/ file."""
    where = Where(file)
    text = read_text(file)
    if text.startswith("$ANSIBLE_VAULT"):
        raise where.error(f"encrypted with ansible-vault; {VAULT_HINT}")
    return yaml_vars(parse_yaml(text, where, bounds), where, "a variables file")


def group_priority(value: Any, where: Where) -> int:
    """``ansible_group_priority`` as an integer."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.lstrip("-").isdigit():
        raise where.error(invalid_setting("ansible_group_priority", value, "expected an integer"))
    return int(text)
