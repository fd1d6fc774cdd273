"""Which inventory values are secrets, and the secret values seen in loaded inventories.

Secrets are recognised by variable name (passwords, passphrases, tokens, keys,
credentials). The values of such variables are remembered when an inventory is loaded (and
when a templated one is rendered), so reports can redact them wherever they appear, even
where they are not written as ``key=value``.
"""

from __future__ import annotations

import functools
import re
import threading

__all__ = ["SENSITIVE_NAME", "is_secret_name", "known_secrets", "remember_secret"]

SENSITIVE_NAME = (r"(?:password|passwd|passphrase|secret|token|credential|api[_-]?key"
               r"|private[_-]?key|access[_-]?key|(?<![a-z0-9])(?:pass|pat)(?![a-z0-9]))")
_NAME = re.compile(SENSITIVE_NAME, re.IGNORECASE)
_NOT_SECRET = re.compile(r"(?i)(?:_file|_path|_dir|_url|_user|_command)$")
_MIN_LENGTH = 4

_lock = threading.Lock()
_known: set[str] = set()


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """Whether a variable of this name holds a secret (``ansible_become_password``,
    ``db_pass``, ``GITHUB_PAT``, ``PASSPHRASE``...) rather than where one is kept
    (``..._file``, ``..._path``)."""
    return bool(_NAME.search(name)) and not _NOT_SECRET.search(name)


def remember_secret(name: str, value: object) -> None:
    """Remember ``value`` for redaction if ``name`` is a secret's name."""
    if not is_secret_name(name) or isinstance(value, bool):
        return
    if isinstance(value, (str, int, float)) and len(str(value)) >= _MIN_LENGTH:
        with _lock:
            _known.add(str(value))


def known_secrets() -> frozenset[str]:
    """Every secret value remembered so far."""
    with _lock:
        return frozenset(_known)
