"""YAML inventory files, read with line numbers and within bounds.

Mappings remember the line of each key, so errors and templates can name the place a
variable is set. Before anything is constructed, the document's nesting depth and its size
with every alias expanded are measured against the limits, so an alias bomb or a deeply
nested document is refused at once. Ansible's ``!unsafe`` strings become ``Unsafe`` (never
templated); ``!vault`` values become ``Vaulted`` markers that the caller reports with the
variable's name.

Where PyYAML has libyaml, libyaml parses (as Ansible's loader does): a document without
anchors, aliases, tags, merge keys or complex keys, most inventories, is built straight
from its events; any other one is composed and constructed as by the pure-Python loader.
A document libyaml cannot read, or that has a character YAML forbids, is read again by
the pure-Python loader, whose message names the problem.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.events import (
    AliasEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import ScalarNode

from gpufleet.inventory.files import Limits, Where

try:
    from yaml.cyaml import CSafeLoader

    _LIBYAML = True
except ImportError:  # a PyYAML built without libyaml: the pure-Python loader reads everything
    _LIBYAML = False

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


class _Unsupported(Exception):
    """The document uses what only the composer builds (anchors, aliases, tags, merge keys,
    complex keys, more than one document)."""


def _too_deep(line: int, max_depth: int) -> _BoundsError:
    return _BoundsError(line, f"nested more than {max_depth} levels deep "
                        "(GPUFLEET_MAX_INVENTORY_DEPTH)")


class _Bounded(Composer):
    """Composing that bounds nesting and notes whether the document has aliases."""

    max_depth = 64
    _depth = 0
    has_aliases = False
    check_event: Any
    peek_event: Any

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        if self.check_event(AliasEvent):
            self.has_aliases = True
        try:
            if self._depth > self.max_depth:
                raise _too_deep(self.peek_event().start_mark.line + 1, self.max_depth)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Loader(_Bounded, yaml.SafeLoader):
    """The pure-Python SafeLoader, bounded, building ``Mapping`` objects."""


if _LIBYAML:
    class _CLoader(_Bounded, CSafeLoader):
        """The same loader over libyaml's parser (composing as the pure-Python one does)."""

        def __init__(self, stream: str) -> None:
            CSafeLoader.__init__(self, stream)
            Composer.__init__(self)


def _construct_mapping(loader: yaml.SafeLoader | CSafeLoader,
                       node: yaml.MappingNode) -> Iterator[Mapping]:
    mapping = Mapping(node.start_mark.line + 1)
    yield mapping
    mapping.update(loader.construct_mapping(node))
    for key_node, _ in node.value:
        mapping.key_lines[loader.construct_object(key_node)] = key_node.start_mark.line + 1


def _construct_unsafe(loader: yaml.SafeLoader | CSafeLoader, node: yaml.Node) -> Any:
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


def _construct_vault(loader: yaml.SafeLoader | CSafeLoader, node: yaml.Node) -> Vaulted:
    return Vaulted(node.start_mark.line + 1)


for _loader in (_Loader, _CLoader) if _LIBYAML else (_Loader,):
    _loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
    _loader.add_constructor("!unsafe", _construct_unsafe)
    _loader.add_constructor("!vault", _construct_vault)
    _loader.add_constructor("!vault-encrypted", _construct_vault)


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


_STR = "tag:yaml.org,2002:str"
_SCALARS = frozenset(f"tag:yaml.org,2002:{name}"
                     for name in ("int", "float", "bool", "null", "timestamp"))
_NO_KEY = object()


def _scalar(loader: _CLoader, event: Any, known: dict[str, Any]) -> Any:
    """A scalar as the composer resolves and the constructor builds it; ``known`` holds the
    plain scalars of the document built so far (their values depend on their text only)."""
    if event.anchor is not None or event.tag not in (None, "!"):
        raise _Unsupported
    if not event.implicit[0]:
        return event.value
    text = event.value
    value = known.get(text, _NO_KEY)
    if value is _NO_KEY:
        resolve: Callable[[type[ScalarNode], str, tuple[bool, bool]], str] = loader.resolve
        tag = resolve(ScalarNode, text, event.implicit)
        if tag == _STR:
            value = text
        elif tag in _SCALARS:
            value = loader.yaml_constructors[tag](loader, ScalarNode(tag, text, event.start_mark))
        else:
            raise _Unsupported
        known[text] = value
    return value


def _opening(event: Any, lines: list[int] | None, items: list[Any], depth: int,
             max_depth: int) -> None:
    """Refuse a collection only the composer builds (an anchor, a tag, a mapping key), or
    one nested too deep."""
    if event.anchor is not None or event.tag is not None or (
            lines is not None and len(items) % 2 == 0):
        raise _Unsupported
    if depth >= max_depth:
        raise _too_deep(event.start_mark.line + 1, max_depth)


def _mapping(items: list[Any], lines: list[int], line: int) -> Mapping:
    """The mapping of alternating keys and values, as the constructor builds it (a key given
    twice keeps its first place and its last value and line)."""
    mapping = Mapping(line)
    mapping.update(zip(items[0::2], items[1::2], strict=True))
    mapping.key_lines.update(zip(items[0::2], lines[0::2], strict=True))
    return mapping


def _built(loader: _CLoader, max_depth: int) -> Any:
    """The document built straight from the parser's events: what composing and
    constructing give (``Mapping`` with its key lines, lists, the same scalars), for a
    document without anchors, aliases, tags, merge keys or complex keys (_Unsupported)."""
    get: Callable[[], Any] = loader.get_event
    get()
    if loader.check_event(StreamEndEvent):
        return None
    get()
    known: dict[str, Any] = {}
    document: list[Any] = []
    # The open collection: its items, its items' lines (None for a sequence), its line;
    # those of the collections around it on the stack.
    items: list[Any] = document
    lines: list[int] | None = None
    line = 0
    stack: list[tuple[list[Any], list[int] | None, int]] = []
    while True:
        event = get()
        kind = type(event)
        if kind is ScalarEvent:
            if len(stack) >= max_depth:
                raise _too_deep(event.start_mark.line + 1, max_depth)
            value = _scalar(loader, event, known)
        elif kind is MappingStartEvent or kind is SequenceStartEvent:
            _opening(event, lines, items, len(stack), max_depth)
            stack.append((items, lines, line))
            items, lines = [], [] if kind is MappingStartEvent else None
            line = event.start_mark.line + 1
            continue
        elif kind is MappingEndEvent or kind is SequenceEndEvent:
            value = items if lines is None else _mapping(items, lines, line)
            items, lines, line = stack.pop()
        else:
            raise _Unsupported
        items.append(value)
        if lines is not None:
            lines.append(event.start_mark.line + 1)
        elif items is document:
            break
    get()
    if not loader.check_event(StreamEndEvent):
        raise _Unsupported
    return document[0]


def _composed(loader: _Loader | _CLoader, bounds: Limits) -> Any:
    loader.max_depth = bounds.max_depth
    node = loader.get_single_node()
    if node is None:
        return None
    if loader.has_aliases:  # without aliases nothing expands beyond what was read
        _check_expanded(node, bounds)
    return loader.construct_document(node)


def _libyaml(text: str, bounds: Limits) -> Any:
    """The document as libyaml parses it: built from its events where it can be, else
    composed and constructed."""
    loader = _CLoader(text)
    try:
        return _built(loader, bounds.max_depth)
    except _Unsupported:
        pass
    finally:
        loader.dispose()
    loader = _CLoader(text)
    try:
        return _composed(loader, bounds)
    finally:
        loader.dispose()


def parse_yaml(text: str, where: Where, bounds: Limits) -> Any:
    """The document in ``text``; every problem becomes an InventoryError at its line."""
    try:
        if _LIBYAML and not yaml.reader.Reader.NON_PRINTABLE.search(text):
            try:
                return _libyaml(text, bounds)
            except (yaml.YAMLError, ValueError, TypeError, OverflowError):
                pass  # the pure-Python loader names the problem as it always has
        loader = _Loader(text)  # the reader refuses characters YAML forbids (a NUL) here
        try:
            return _composed(loader, bounds)
        finally:
            loader.dispose()
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


def plain(value: Any) -> Any:
    """The value with every ``Mapping`` turned into a plain dict (aliases copied)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
