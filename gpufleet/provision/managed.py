"""Managed files and links: compare desired content with the host's, diff it, redact secrets."""

from __future__ import annotations

import difflib
import shlex
from typing import Any

import jinja2

from gpufleet.facts.gather import Facts
from gpufleet.inventory.secrets import redact
from gpufleet.provision.plan import Change, Put, Run

HEADER = "Managed by gpufleet (role {role}); local edits are reported as drift and replaced."
_env = jinja2.Environment(
    loader=jinja2.PackageLoader("gpufleet", "templates"),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,  # noqa: S701 - configuration files, not HTML
)
_env.filters["shell_quote"] = shlex.quote


def render(template: str, **values: Any) -> str:
    """Render a template from templates/ with strict undefined variables."""
    return _env.get_template(template).render(**values)


def unified_diff(path: str, before: str, after: str) -> str:
    """A unified diff of a file's current and desired content, secrets redacted."""
    lines = difflib.unified_diff(redact(before).splitlines(keepends=True),
                                 redact(after).splitlines(keepends=True),
                                 fromfile=f"{path} (on host)", tofile=f"{path} (desired)")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def file_change(role: str, facts: Facts, path: str, content: str | bytes, *,
                mode: int = 0o644, owner: str = "root:root") -> Change | None:
    """The change that makes ``path`` hold ``content`` with ``mode``/``owner``, or None.
    Text content gets a diff; bytes (a keyring) do not."""
    state = facts.file(path)
    data = content if isinstance(content, bytes) else content.encode()
    want_mode = f"{mode:o}"
    if state.exists and state.content == data and state.mode == want_mode \
            and state.owner == owner:
        return None
    put = Put(path, data, mode, owner)
    text = None if isinstance(content, bytes) else content
    if not state.exists:
        return Change(role, f"file {path}", "create", "absent", f"{len(data)} bytes", [put],
                      diff=None if text is None else unified_diff(path, "", text))
    if state.content == data:
        return Change(role, f"file {path}", "set mode", f"{state.mode} {state.owner}",
                      f"{want_mode} {owner}", [put])
    return Change(role, f"file {path}", "update", f"{len(state.content)} bytes (differs)",
                  f"{len(data)} bytes", [put],
                  diff=None if text is None else unified_diff(path, state.text, text))


def digest_change(role: str, facts: Facts, path: str, content: bytes, *, digest: str,
                  steps: list[Any], mode: int = 0o644, owner: str = "root:root"
                  ) -> Change | None:
    """The change for a file known on the host by its digest only (``file_digest_fact``):
    None when the host's file has ``digest`` (the SHA-256 of ``content``), ``mode`` and
    ``owner``; no diff (the host's bytes were not read)."""
    state = facts.file_digest(path)
    want_mode = f"{mode:o}"
    if state.exists and state.sha256 == digest and state.mode == want_mode \
            and state.owner == owner:
        return None
    if not state.exists:
        return Change(role, f"file {path}", "create", "absent", f"{len(content)} bytes", steps)
    if state.sha256 == digest:
        return Change(role, f"file {path}", "set mode", f"{state.mode} {state.owner}",
                      f"{want_mode} {owner}", steps)
    return Change(role, f"file {path}", "update", f"{state.size} bytes (differs)",
                  f"{len(content)} bytes", steps)


def link_change(role: str, facts: Facts, path: str, target: str) -> Change | None:
    """The change that makes ``path`` a symbolic link to ``target``, or None."""
    current = facts.link(path)
    if current == target:
        return None
    tmp = f"{path}.gpufleet-tmp"
    parent = shlex.quote(path.rsplit("/", 1)[0] or "/")
    command = f"mkdir -p {parent} && ln -sfn {shlex.quote(target)} {shlex.quote(tmp)} && " \
              f"mv -Tf {shlex.quote(tmp)} {shlex.quote(path)}"
    before = "absent" if current is None else ("not a link" if current == "" else current)
    return Change(role, f"link {path}", "link", before, target,
                  [Run(command, f"point {path} at {target}")])
