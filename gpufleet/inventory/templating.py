"""Ansible-style ``{{ }}`` templates in inventory values, rendered per host when read.

``HostVars`` holds a host's merged variables as the inventory wrote them and renders a
value the first time it is read, with the host's other variables (themselves rendered on
demand), so a template that gpufleet never reads cannot fail a run. What is rendered is
what inventories commonly hold: variable references, the filters in ``FILTERS``, tests,
conditionals and arithmetic, in a sandboxed Jinja2 environment where undefined variables
are errors. Ansible's magic variables render as Ansible renders them: ``inventory_hostname``
and ``inventory_hostname_short``, ``inventory_file`` and ``inventory_dir`` (the file that
first named the host, and its directory), ``group_names``, ``groups`` (every group's hosts in
Ansible's order) and ``hostvars`` (another host's variables, rendered for that host).
Lookups, ``vars``, other function calls, unknown filters, undefined variables and reference
cycles are refused with one line naming the host, the variable and where it is set.
``!unsafe`` values (``Unsafe``) are never templated, and a template's output is not
templated again.

One render is bounded before it allocates or loops: every ``{% for %}`` counts its
iterations against one budget (``MAX_ITERATIONS``, loops nested at most
``MAX_LOOP_DEPTH`` deep; a loop cannot recurse, for ``loop()`` is a call), ``~``, ``+``,
``*``, ``%`` and the ``replace`` and ``join`` filters compute the size of their result
first (``MAX_RESULT``), method calls are limited to an allow-list of ones that cannot grow a
value (``.ljust(10**10)`` is refused, not attempted), and the whole render has a deadline
(``MAX_RENDER_S`` of the rendering thread's CPU time: a controller busy with other
work, whose renders wait for a core, fails none of them).
"""

from __future__ import annotations

import contextvars
import copy
import functools
import itertools
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.filters import FILTERS as JINJA_FILTERS
from jinja2.nativetypes import NativeCodeGenerator
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gpufleet.errors import InventoryError
from gpufleet.inventory.read_yaml import Unsafe
from gpufleet.inventory.secrets import remember_secret

__all__ = ["FILTERS", "Fleet", "HostVars", "SharedRenders", "TemplateError", "is_template",
           "needs_render"]

MAX_RESULT = 1024 * 1024
MAX_REFERENCE_DEPTH = 40
MAX_ITERATIONS = 100_000
MAX_LOOP_DEPTH = 3
MAX_RENDER_S = 2.0
# Methods a template may call: none of them makes a value larger than the ones it has.
ALLOWED_METHODS = {
    str: frozenset({"lower", "upper", "strip", "lstrip", "rstrip", "split", "rsplit",
                    "splitlines", "startswith", "endswith", "title", "capitalize", "count",
                    "find", "rfind", "isdigit", "isalpha", "isalnum", "isspace", "replace"}),
    dict: frozenset({"items", "keys", "values", "get"}),
    list: frozenset({"index", "count"}),
}
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_LOOKUPS = frozenset({"lookup", "query", "q"})
_UNSUPPORTED_NAMES = {
    "vars": "the vars dictionary",
}
_ATOMIC = frozenset({str, int, float, bool, type(None), Unsafe})  # immutable, never undefined
_UNSET = object()
# The magic variables whose value is the host's own (HostVars.magic): a template that uses
# one is rendered for each host, never shared.
_MAGIC = frozenset({"inventory_hostname", "inventory_hostname_short", "inventory_file",
                    "inventory_dir", "group_names"})
_TRUE = frozenset({"yes", "on", "1", "true", "y", "t"})


class TemplateError(InventoryError):
    """An inventory value's template cannot be rendered; the message names host and variable."""


def is_template(value: object) -> bool:
    """Whether a value is a string that Ansible would template (it has ``{{``, ``{%`` or
    ``{#``)."""
    return isinstance(value, str) and not isinstance(value, Unsafe) and (
        "{{" in value or "{%" in value or "{#" in value)


def _to_bool(value: object) -> bool:
    """Ansible's ``bool`` filter."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, (int, float)):
        return value == 1
    return str(value).strip().lower() in _TRUE


FILTERS: dict[str, Callable[..., Any]] = {
    **{name: JINJA_FILTERS[name] for name in (
        "default", "d", "lower", "upper", "int", "join", "string", "trim", "replace")},
    "bool": _to_bool,
}


class _Undefined(jinja2.ChainableUndefined, jinja2.StrictUndefined):
    """Undefined: attribute access chains (so ``a.b | default(x)`` works), any use fails."""


def _size(value: object) -> int:
    return len(value) if isinstance(value, (str, list, tuple)) else 0


def _defined(value: Any) -> Any:
    """The value, after failing on any undefined part of it."""
    if type(value) in _ATOMIC:
        return value
    if isinstance(value, jinja2.Undefined):
        str(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _defined(item)
    elif isinstance(value, dict):
        for item in value.values():
            _defined(item)
    return value


@dataclass
class _Budget:
    """What one render (with the variables it renders on the way) may still spend."""

    iterations: int = MAX_ITERATIONS
    deadline: float = 0.0

    def spend(self, iterations: int = 0) -> None:
        self.iterations -= iterations
        if self.iterations < 0:
            raise _Problem(f"loops more than {MAX_ITERATIONS} times")
        if time.thread_time() > self.deadline:
            raise _Problem(f"takes more than {MAX_RENDER_S:g}s to render")


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("budget", default=None)


def _spend(iterations: int = 0) -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.spend(iterations)


def _too_large() -> _Problem:
    return _Problem(f"renders to more than {MAX_RESULT} characters")


def _loop(value: Any) -> list[Any]:
    """The items a ``{% for %}`` goes over, counted against the render's budget before the
    loop runs (``| _gf_loop`` is put on every loop's iterable when a template is compiled)."""
    if isinstance(value, jinja2.Undefined):
        str(value)
    items = list(itertools.islice(iter(value), MAX_ITERATIONS + 1))
    _spend(len(items))
    return items


def _text_of(parts: Iterable[Any]) -> str:
    """The parts joined as text, refused once longer than ``MAX_RESULT``, before joining."""
    pieces, total = [], 0
    for part in parts:
        piece = part if type(part) is str else str(_defined(part))
        total += len(piece)
        if total > MAX_RESULT:
            raise _too_large()
        pieces.append(piece)
    _spend()
    return "".join(pieces)


def _joined(items: Any, separator: str = "", attribute: Any = None) -> str:
    """The ``join`` filter, its result's size known before it is built."""
    values = [_defined(item) for item in _loop(items)]
    if attribute is not None:
        values = [v[attribute] if isinstance(v, dict) else getattr(v, str(attribute))
                  for v in values]
    texts = [str(v) for v in values]
    if sum(map(len, texts)) + len(str(separator)) * max(0, len(texts) - 1) > MAX_RESULT:
        raise _too_large()
    return str(separator).join(texts)


def _replaced(value: Any, old: Any, new: Any, count: int | None = None) -> str:
    """``str.replace`` (and the ``replace`` filter), its result's size known before it is
    built."""
    text, old, new = str(_defined(value)), str(old), str(new)
    found = text.count(old) if old else len(text) + 1
    if count is not None and count >= 0:
        found = min(found, count)
    if len(text) + found * (len(new) - len(old)) > MAX_RESULT:
        raise _too_large()
    return text.replace(old, new, -1 if count is None else count)


def _percent_bound(fmt: str, args: Any) -> None:
    """``fmt % args`` refused before it runs when its result could exceed ``MAX_RESULT``:
    a width or precision that large (``'%0100000000d' % 1``), or the arguments' text."""
    widths = 0
    for match in _PERCENT_SPEC.finditer(fmt):
        for size in match.groups():
            if size == "*":
                raise _Problem("uses a '*' width, which gpufleet does not render")
            widths += int(size or 0)
    values = args.values() if isinstance(args, dict) else \
        args if isinstance(args, tuple) else (args,)
    if len(fmt) + widths + sum(len(str(v)) for v in values) > MAX_RESULT:
        raise _too_large()


def _concat(chunks: Iterator[Any]) -> Any:
    """A template that is one expression gives that value (an int stays an int); otherwise
    the text of every piece."""
    parts = [_defined(part) for part in chunks]
    if len(parts) == 1:
        return parts[0]
    return _text_of(parts)


class _CodeGenerator(NativeCodeGenerator):
    """Native output in which only literal text is folded at compile time, so a constant
    expression such as ``{{ 40 + 2 }}`` keeps its type (42, not "42")."""

    def _output_child_to_const(self, node: nodes.Expr, frame: Any, finalize: Any) -> str:
        if not isinstance(node, nodes.TemplateData):
            raise nodes.Impossible()
        return super()._output_child_to_const(node, frame, finalize)  # type: ignore[no-any-return]


class _Environment(ImmutableSandboxedEnvironment):
    """A sandbox with native result types, and ``+``, ``*``, ``**``, ``%`` and method calls
    bounded before they run."""

    code_generator_class = _CodeGenerator
    concat = staticmethod(_concat)  # type: ignore[assignment]

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.intercepted_binops = frozenset({"+", "*", "**", "%"})

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _spend()
        if operator == "*":
            count = right if isinstance(right, int) else left if isinstance(left, int) else 1
            if max(_size(left), _size(right)) * abs(count) > MAX_RESULT:
                raise _too_large()
        if operator == "+" and _size(left) + _size(right) > MAX_RESULT:
            raise _too_large()
        if operator == "%" and isinstance(left, str):
            _percent_bound(left, right)
        if operator == "**" and isinstance(left, int) and isinstance(right, int) \
                and abs(left) > 1 and right * math.log2(abs(left)) > 4096:
            raise _Problem("computes a number too large to use")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Context, __obj: Any, *args: Any,
             **kwargs: Any) -> Any:
        """A method call from a template: only the allowed ones, ``replace`` bounded."""
        _spend()
        owner, name = getattr(__obj, "__self__", None), getattr(__obj, "__name__", "?")
        allowed = next((names for kind, names in ALLOWED_METHODS.items()
                        if isinstance(owner, kind)), None)
        if allowed is None or name not in allowed:
            kind = f"{type(owner).__name__}." if owner is not None else ""
            raise _Problem(f"calls {kind}{name}(), which gpufleet does not render")
        if name == "replace":  # Jinja passes its own scope along; replace takes none of it
            return _replaced(owner, *args, **{k: v for k, v in kwargs.items()
                                              if k not in ("_loop_vars", "_block_vars")})
        return super().call(__context, __obj, *args, **kwargs)


_ENV = _Environment(undefined=_Undefined, autoescape=False, keep_trailing_newline=True)
_ENV.filters = {**FILTERS, "replace": _replaced, "join": _joined, "_gf_loop": _loop,
                "_gf_concat": _text_of}
_ENV.globals = {}


class _Problem(Exception):
    """Why one template cannot be rendered (turned into a TemplateError with its place)."""


def _check(template: nodes.Template) -> None:
    """Refuse what gpufleet does not render, before rendering anything."""
    for call in template.find_all(nodes.Call):
        if isinstance(call.node, nodes.Name):
            if call.node.name in _LOOKUPS:
                raise _Problem(f"uses {call.node.name}(), and gpufleet does not run Ansible "
                               "lookups (write the value itself in the inventory)")
            raise _Problem(f"calls {call.node.name}(), which gpufleet does not provide")
    for name in template.find_all(nodes.Name):
        if name.name in _UNSUPPORTED_NAMES and name.ctx == "load":
            raise _Problem(f"refers to {_UNSUPPORTED_NAMES[name.name]}, which gpufleet does "
                           "not template (write the value itself in the inventory)")
    for node in template.find_all((nodes.Filter, nodes.Test)):
        if isinstance(node, nodes.Filter) and node.name not in FILTERS:
            raise _Problem(f"uses the filter '{node.name}', which gpufleet does not provide "
                           f"(it renders {', '.join(sorted(FILTERS))})")
    if _loop_depth(template) > MAX_LOOP_DEPTH:
        raise _Problem(f"nests loops more than {MAX_LOOP_DEPTH} deep")


def _loop_depth(node: nodes.Node) -> int:
    inner = max((_loop_depth(child) for child in node.iter_child_nodes()), default=0)
    return inner + isinstance(node, nodes.For)


def _bound(template: nodes.Template) -> nodes.Template:
    """Every loop's iterable through ``_gf_loop`` and every ``~`` through ``_gf_concat``,
    so both are counted and sized before they run."""
    for loop in template.find_all(nodes.For):
        loop.iter = nodes.Filter(loop.iter, "_gf_loop", [], [], None, None, lineno=loop.lineno)
    for concat in list(template.find_all(nodes.Concat)):
        parts = nodes.List(list(concat.nodes), lineno=concat.lineno)
        bounded = nodes.Filter(parts, "_gf_concat", [], [], None, None, lineno=concat.lineno)
        concat.nodes = [bounded]
    return template


class _Scope(Mapping[str, Any]):
    """What a template sees: the host's variables, rendered on demand, and its name."""

    def __init__(self, owner: HostVars) -> None:
        self.owner = owner

    def __getitem__(self, key: str) -> Any:
        if key in self.owner.magic:
            return self.owner.magic[key]
        return self.owner[key]

    def __contains__(self, key: object) -> bool:
        return key in self.owner.magic or key in self.owner

    def __iter__(self) -> Iterator[str]:
        yield from self.owner.magic
        yield from self.owner

    def __len__(self) -> int:
        return len(self.owner.magic) + len(self.owner)


class Fleet:
    """What the templates of every host of one inventory see of the others: ``groups``
    (every group's hosts, in Ansible's order) and ``hostvars``; and the one lock their
    renders share, since a template may render another host's variable while that host
    renders one of its own (a lock per host could deadlock two threads)."""

    def __init__(self) -> None:
        self.groups: dict[str, list[str]] = {}
        self.hosts: dict[str, HostVars] = {}
        self.lock = threading.RLock()
        self.hostvars = _HostVarsView(self)


class _HostVarsView(Mapping[str, Any]):
    """``hostvars``: each host's variables and magic variables, rendered for that host."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def __getitem__(self, name: str) -> Any:
        return _Scope(self._fleet.hosts[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._fleet.hosts)

    def __len__(self) -> int:
        return len(self._fleet.hosts)


class HostVars(MutableMapping[str, Any]):
    """One host's variables; templated values are rendered when first read. Safe to read
    from several threads (a run reads other hosts' variables, e.g. for firewall rules)."""

    def __init__(self, host: str, raw: dict[str, Any], origins: dict[str, str],
                 templated: set[str] | None = None, *, shared: SharedRenders | None = None,
                 own: set[str] | None = None, fleet: Fleet | None = None,
                 source: str | None = None, group_names: list[str] | None = None) -> None:
        """``raw`` is the host's own dict, but its values may be shared with other hosts: a
        list or mapping is copied for the host when first read. ``templated`` names the
        keys whose values need rendering, when the caller knows them. ``shared`` holds the
        renders of the hosts whose values are ``shared.values`` except for the keys each
        sets itself, ``own``. ``raw``, ``origins``, ``templated`` and ``own`` are taken
        over, not copied. ``fleet`` is the inventory's hosts and groups, ``source`` the
        absolute path of the file that first named the host, ``group_names`` its groups
        but ``all``, sorted: what the magic variables give."""
        self.host = host
        self._raw = raw
        self._origins = origins
        self._templated = templated if templated is not None else {
            key for key, value in raw.items() if needs_render(value)}
        self._rendered: dict[str, Any] = {}
        self._shared = shared
        self._own = own if own is not None else set()
        self._active: list[str] = []
        self._fleet = fleet
        self._source = source
        self._group_names = group_names
        self._lock = fleet.lock if fleet is not None else threading.RLock()
        self.magic: dict[str, Any] = {
            "inventory_hostname": host, "inventory_hostname_short": host.split(".", 1)[0],
            "inventory_file": source, "inventory_dir": os.path.dirname(source) if source
            else None, "group_names": group_names or []}
        if fleet is not None:
            self.magic.update(groups=fleet.groups, hostvars=fleet.hostvars)

    def __deepcopy__(self, memo: dict[int, Any]) -> HostVars:
        return HostVars(self.host, copy.deepcopy(self._raw, memo), dict(self._origins),
                        set(self._templated), fleet=self._fleet, source=self._source,
                        group_names=self._group_names)

    def origin(self, key: str) -> str | None:
        """Where the variable's winning value is set (``file:line`` or ``file``)."""
        return self._origins.get(key)

    def raw(self) -> dict[str, Any]:
        """The variables as the inventory wrote them, templates unrendered (the host's own
        copies of lists and mappings)."""
        with self._lock:
            return {key: _detached(value) for key, value in self._raw.items()}

    def __getitem__(self, key: str) -> Any:
        value = self._rendered.get(key, _UNSET)
        if value is not _UNSET:
            return value
        value = self._raw[key]
        if type(value) in _ATOMIC and key not in self._templated:
            return value  # immutable and not a template: nothing to render or copy
        with self._lock:
            return self._get(key)

    def _get(self, key: str) -> Any:
        if key in self._rendered:
            return self._rendered[key]
        value = self._raw[key]
        if key not in self._templated:
            if isinstance(value, (dict, list)):
                value = self._raw[key] = _detached(value)
            self._rendered[key] = value
            self._handed_out(key, value)
            return value
        shared = self._sharing(key)
        if shared is not None:
            cached = shared.rendered.get(key, _UNSET)
            if cached is not _UNSET:
                rendered = _detached(cached)
                remember_secret(key, rendered)
                self._rendered[key] = rendered
                self._handed_out(key, rendered)
                return rendered
        if key in self._active:
            cycle = " -> ".join([*self._active[self._active.index(key):], key])
            raise self._error(key, f"refers to itself: {cycle}")
        if len(self._active) >= MAX_REFERENCE_DEPTH:
            raise self._error(key, f"references nest more than {MAX_REFERENCE_DEPTH} deep")
        self._active.append(key)
        try:
            rendered = self._render(key, value)
        finally:
            self._active.pop()
        remember_secret(key, rendered)
        self._rendered[key] = rendered
        if shared is not None:
            shared.rendered[key] = _detached(rendered)
        self._handed_out(key, rendered)
        return rendered

    def _sharing(self, key: str) -> SharedRenders | None:
        """The shared renders that hold, or will hold, this host's render of ``key``: none
        where the result may be the host's own (``key`` or a variable its templates reach
        is set by the host, or is the host's name)."""
        shared = self._shared
        if shared is None or key in self._own:
            return None
        reach = shared.reach(key)
        return shared if reach is not None and reach.isdisjoint(self._own) else None

    def _handed_out(self, key: str, value: Any) -> None:
        """A value the caller may change in place (a list, a mapping) is the host's own from
        now on: templates that reach it render for this host alone."""
        if self._shared is not None and type(value) not in _ATOMIC:
            self._own.add(key)

    def __setitem__(self, key: str, value: Any) -> None:
        with self._lock:
            self._shared = None  # the host's values are no longer those it shared
            self._raw[key] = value
            self._origins.pop(key, None)
            if needs_render(value):
                self._templated.add(key)
            else:
                self._templated.discard(key)
            self._rendered.clear()

    def __delitem__(self, key: str) -> None:
        with self._lock:
            self._shared = None
            del self._raw[key]
            self._origins.pop(key, None)
            self._templated.discard(key)
            self._rendered.clear()

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __repr__(self) -> str:
        return f"HostVars({self.host!r}, {self._raw!r})"

    def _render(self, key: str, value: Any) -> Any:
        if isinstance(value, list):
            return [self._render(key, item) for item in value]
        if isinstance(value, dict):
            return {name: self._render(key, item) for name, item in value.items()}
        if not is_template(value):
            return _detached(value)
        try:
            return self._render_text(value)
        except TemplateError:
            raise
        except _Problem as exc:
            raise self._error(key, f"{exc}: {_shown(value)}") from None
        except jinja2.TemplateSyntaxError as exc:
            raise self._error(key, f"invalid template ({exc.message}): {_shown(value)}") from None
        except jinja2.UndefinedError as exc:
            raise self._error(key, f"{exc.message}: {_shown(value)}") from None
        except jinja2.exceptions.SecurityError as exc:
            raise self._error(key, f"refused by the sandbox ({exc}): {_shown(value)}") from None
        except (jinja2.TemplateError, ArithmeticError, TypeError, ValueError, LookupError,
                AttributeError, RecursionError, MemoryError) as exc:
            raise self._error(key, f"cannot be rendered ({type(exc).__name__}: {exc}): "
                              f"{_shown(value)}") from None

    def _render_text(self, text: str) -> Any:
        compiled = _compiled(text)
        owner = _BUDGET.get() is None  # the outermost render: the variables it renders share
        token = _BUDGET.set(_Budget(deadline=time.thread_time() + MAX_RENDER_S)) if owner \
            else None
        try:
            result = compiled.render(_Scope(self))
        finally:
            if token is not None:
                _BUDGET.reset(token)
        if isinstance(result, str) and len(result) > MAX_RESULT:
            raise _too_large()
        # a template that is one name gives that value itself: ``groups`` is every host's
        return _detached(result) if type(result) in (dict, list) else result

    def _error(self, key: str, problem: str) -> TemplateError:
        where = self._origins.get(key)
        place = f" ({where})" if where else ""
        via = self._active[:-1] if self._active and self._active[-1] == key else self._active
        trail = f" (needed by {' -> '.join(via)})" if via else ""
        return TemplateError(f"host '{self.host}': variable '{key}'{place} {problem}{trail}")


class SharedRenders:
    """The renders that the hosts of one combination of groups share. A templated value
    that refers, directly or through the variables it renders on the way, neither to the
    host's name nor to a variable the host sets itself renders the same for each of these
    hosts: the first host that reads it renders it, the others take a copy. A render that
    fails is not kept (each host fails with its own name)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        """``values``: the variables the hosts share, as the inventory wrote them."""
        self.values = values
        self.rendered: dict[str, Any] = {}
        self._reach: dict[str, frozenset[str] | None] = {}

    def reach(self, key: str) -> frozenset[str] | None:
        """Every name the templates of ``key`` can look up, and those of the shared values
        they reach; None when one of them refers to the host's name or does not compile
        (such a value is rendered for each host)."""
        if key in self._reach:
            return self._reach[key]
        names: set[str] = set()
        pending, seen = [key], set()
        result: frozenset[str] | None = None
        try:
            while pending:
                name = pending.pop()
                if name in seen or name not in self.values:
                    continue
                seen.add(name)
                for text in _templates(self.values[name]):
                    looked_up = _compiled(text).names
                    names.update(looked_up)
                    pending.extend(looked_up)
            result = None if not names.isdisjoint(_MAGIC) else frozenset(names)
        except Exception:  # rendering it names the problem, host by host
            result = None
        self._reach[key] = result
        return result


def _templates(value: Any) -> Iterator[str]:
    """The templates in a value (itself, or the items of a list or mapping)."""
    if isinstance(value, list):
        for item in value:
            yield from _templates(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _templates(item)
    elif is_template(value):
        yield value


class _Ref:
    """Where a variable's value goes in a template's output (see ``_Compiled.direct``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Probe(Mapping[str, Any]):
    """A scope that has every name, each value a ``_Ref`` to it, and records the lookups."""

    def __init__(self) -> None:
        self.lookups: list[tuple[str, str]] = []

    def __contains__(self, key: object) -> bool:
        self.lookups.append(("in", str(key)))
        return True

    def __getitem__(self, key: str) -> _Ref:
        self.lookups.append(("get", key))
        return _Ref(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


class _Compiled:
    """A template, compiled once per text. One that is only text and variables
    (``{{ inventory_hostname }}.{{ domain }}``) is also kept as what its code does: the names
    it looks up, in order, and the pieces it outputs, so rendering it needs no Jinja
    context; any name missing from the scope renders it through Jinja, which fails it."""

    def __init__(self, text: str) -> None:
        tree = _ENV.parse(text)
        _check(tree)
        plain = all(isinstance(output, nodes.Output) and all(
            isinstance(child, (nodes.TemplateData, nodes.Name)) for child in output.nodes)
            for output in tree.body)
        self._tree = tree
        self._names: frozenset[str] | None = None
        code = _ENV.compile(_bound(tree))
        self.template = _ENV.template_class.from_code(_ENV, code, _ENV.make_globals(None), None)
        self.direct = self._pieces() if plain else None

    @property
    def names(self) -> frozenset[str]:
        """Every name the template can look up in its scope (as Jinja finds them)."""
        if self._names is None:
            self._names = frozenset(meta.find_undeclared_variables(self._tree))
        return self._names

    def _pieces(self) -> tuple[tuple[str, ...], tuple[Any, ...]] | None:
        """What the code looks up and outputs, seen by running it over a ``_Probe``: each
        name looked up once (in, then get), each output a text or a ``_Ref``; else None."""
        probe = _Probe()
        try:
            output: list[Any] = list(self.template.root_render_func(
                self.template.new_context(probe, shared=True)))  # type: ignore[arg-type]
        except Exception:  # such a template is rendered through Jinja only
            return None
        names = tuple(key for op, key in probe.lookups if op == "get")
        expected = [(op, key) for key in names for op in ("in", "get")]
        if probe.lookups != expected or len(set(names)) != len(names) or not all(
                type(piece) is str or (type(piece) is _Ref and piece.name in names)
                for piece in output):
            return None
        return names, tuple(output)

    def render(self, scope: Mapping[str, Any]) -> Any:
        """The template's result over ``scope``, as ``_concat`` gives it."""
        if self.direct is not None:
            names, pieces = self.direct
            values: dict[str, Any] = {}
            for name in names:
                if name not in scope:
                    break
                values[name] = scope[name]
            else:
                return _concat(iter([values[piece.name] if type(piece) is _Ref else piece
                                     for piece in pieces]))
        context = self.template.new_context(scope, shared=True)  # type: ignore[arg-type]
        return _ENV.concat(self.template.root_render_func(context))


@functools.lru_cache(maxsize=4096)
def _compiled(text: str) -> _Compiled:
    return _Compiled(text)


def _detached(value: Any) -> Any:
    """A copy of ``value`` that shares nothing mutable with it (lists and mappings copied,
    immutable scalars kept, anything else deep-copied)."""
    kind = type(value)
    if kind in _ATOMIC:
        return value
    if kind is list:
        return [item if type(item) in _ATOMIC else _detached(item) for item in value]
    if kind is dict:
        return {key: item if type(item) in _ATOMIC else _detached(item)
                for key, item in value.items()}
    return copy.deepcopy(value)


def needs_render(value: Any) -> bool:
    """Whether ``value`` holds a template: it is one, or a list or mapping has one."""
    kind = type(value)
    if kind is str:
        return "{{" in value or "{%" in value or "{#" in value
    if kind in _ATOMIC:
        return False
    if isinstance(value, (list, dict)):
        for item in value.values() if isinstance(value, dict) else value:
            if type(item) is str:
                if "{{" in item or "{%" in item or "{#" in item:
                    return True
            elif type(item) not in _ATOMIC and needs_render(item):
                return True
        return False
    return is_template(value)


def _shown(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")
