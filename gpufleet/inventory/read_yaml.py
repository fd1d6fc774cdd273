"""YAML inventory files, read with line numbers and within bounds.

Mappings remember the line of each key, so errors and templates can name the place a
variable is set. Before anything is constructed, the document's nesting depth and its size
with every alias expanded are measured against the limits, so an alias bomb or a deeply
nested document is refused at once. Ansible's ``!unsafe`` strings become ``Unsafe`` (never
templated); ``!vault`` values become ``Vaulted`` markers that the caller reports with the
variable's name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from gpufleet.inventory.files import Limits, Where

__all__ = ["Mapping", "Unsafe", "Vaulted", "parse_yaml", "plain"]


class Unsafe(str):
    """A string that is never templated (Ansible's ``!unsafe``)."""

    __slots__ = ()


class Vaulted:
    """A ``!vault`` value: encrypted with ansible-vault, which gpufleet cannot decrypt."""

    def __init__(self, line: int) -> None:
        self.line = line


class Mapping(dict[Any, Any]):
    """A YAML mapping that knows the line it starts on and the line of each key."""

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[Any, int] = {}


class _BoundsError(Exception):
    def __init__(self, line: int, problem: str) -> None:
        super().__init__(problem)
        self.line = line
        self.problem = problem


class _Loader(yaml.SafeLoader):
    """A SafeLoader that bounds nesting while composing and builds ``Mapping`` objects."""

    max_depth = 64
    _depth = 0
    has_aliases = False

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        if self.check_event(yaml.AliasEvent):
            self.has_aliases = True
        try:
            if self._depth > self.max_depth:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise _BoundsError(mark.line + 1, f"nested more than {self.max_depth} levels "
                                   "deep (GPUFLEET_MAX_INVENTORY_DEPTH)")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> Iterator[Mapping]:
    mapping = Mapping(node.start_mark.line + 1)
    yield mapping
    mapping.update(loader.construct_mapping(node))
    for key_node, _ in node.value:
        mapping.key_lines[loader.construct_object(key_node)] = key_node.start_mark.line + 1


def _construct_unsafe(loader: _Loader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return Unsafe(loader.construct_scalar(node))
    if isinstance(node, yaml.SequenceNode):
        return [_unsafe(item) for item in loader.construct_sequence(node, deep=True)]
    return {key: _unsafe(value) for key, value in
            loader.construct_mapping(node, deep=True).items()}  # type: ignore[arg-type]


def _unsafe(value: Any) -> Any:
    if isinstance(value, str):
        return Unsafe(value)
    if isinstance(value, list):
        return [_unsafe(item) for item in value]
    if isinstance(value, dict):
        return {key: _unsafe(item) for key, item in value.items()}
    return value


def _construct_vault(loader: _Loader, node: yaml.Node) -> Vaulted:
    return Vaulted(node.start_mark.line + 1)


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_Loader.add_constructor("!unsafe", _construct_unsafe)
_Loader.add_constructor("!vault", _construct_vault)
_Loader.add_constructor("!vault-encrypted", _construct_vault)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [item for pair in node.value for item in pair]
    return []


def _check_expanded(root: yaml.Node, bounds: Limits) -> None:
    """Measure the document with every alias expanded, without expanding it: refuse it when
    it holds more than ``max_nodes`` values or nests deeper than ``max_depth``, or when an
    alias refers to a node that contains it."""
    sizes: dict[int, tuple[int, int]] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = _children(node)
        if not children_done:
            open_nodes.add(key)
            stack.append((node, True))
            for child in children:
                if id(child) in open_nodes:
                    raise _BoundsError(child.start_mark.line + 1,
                                       "an alias refers to a node that contains it")
                if id(child) not in sizes:
                    stack.append((child, False))
            continue
        open_nodes.discard(key)
        measured = [sizes[id(child)] for child in children]
        count = 1 + sum(size for size, _ in measured)
        depth = 1 + max((height for _, height in measured), default=0)
        sizes[key] = (count, depth)
        if count > bounds.max_nodes:
            raise _BoundsError(node.start_mark.line + 1,
                               f"more than {bounds.max_nodes} values once its aliases are "
                               "expanded (GPUFLEET_MAX_INVENTORY_NODES)")
        if depth > bounds.max_depth:
            raise _BoundsError(node.start_mark.line + 1,
                               f"nested more than {bounds.max_depth} levels deep once its "
                               "aliases are expanded (GPUFLEET_MAX_INVENTORY_DEPTH)")


def parse_yaml(text: str, where: Where, bounds: Limits) -> Any:
    """The document in ``text``; every problem becomes an InventoryError at its line."""
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # the reader refuses characters YAML forbids (a NUL) here
        loader.max_depth = bounds.max_depth
        node = loader.get_single_node()
        if node is None:
            return None
        if loader.has_aliases:  # without aliases nothing expands beyond what was read
            _check_expanded(node, bounds)
        return loader.construct_document(node)
    except _BoundsError as exc:
        raise where.at(exc.line).error(exc.problem) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        reason = exc.problem or exc.context or "malformed document"
        raise where.at(line).error(f"invalid YAML: {reason}") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise where.at(line).error(f"invalid YAML: {exc.reason}") from None
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        raise where.error(f"invalid YAML: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()


def plain(value: Any) -> Any:
    """The value with every ``Mapping`` turned into a plain dict (aliases copied)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
