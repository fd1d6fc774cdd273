"""Which inventory values are secrets, the secret values seen in loaded inventories, and
the one redaction every report, diff and log line goes through.

Secrets are recognised by variable name (passwords, passphrases, tokens, keys,
credentials, authentication, Ansible's ``vault_`` variables), at any depth of a value. The
values of such variables are remembered when an inventory is loaded (and when a templated
one is rendered), so reports can redact them wherever they appear, even where they are not
written as ``key=value``.
"""

from __future__ import annotations

import functools
import re
import threading

__all__ = ["MASK", "SENSITIVE_NAME", "holds_secret", "is_secret_name", "known_secrets",
           "redact", "remember_secret"]

# A credential word anywhere in the name, or one of the short ones as a word of its own
# (HF_AUTH, MUNGE_KEY, SLURM_JWT, DB_PWD, but not author, keyring or bypass), or Ansible's
# convention for a variable kept in a vault (vault_hf_token, which hf_token then refers to).
SENSITIVE_NAME = (r"(?:password|passwd|passphrase|secret|token|credential|api[_-]?key"
                  r"|private[_-]?key|access[_-]?key|cookie"
                  r"|(?<![a-z0-9])(?:pass|pat|pwd|auth|key|jwt)(?![a-z0-9])"
                  r"|(?<![a-z0-9])vault_)")
_NAME = re.compile(SENSITIVE_NAME, re.IGNORECASE)
_NOT_SECRET = re.compile(r"(?i)(?:_file|_path|_dir|_url|_user|_command)$")
_MIN_LENGTH = 4
MASK = "********"
_KEY_VALUE = re.compile(
    rf"(?im)^(?![^=:\n]*\s-)(?P<key>[^=:\n]*{SENSITIVE_NAME}[^=:\n]*\s*[=:]\s*)(?P<value>.+)$")
_OPTION = re.compile(
    rf"(?i)(?P<key>(?<!\S)--?[\w-]*{SENSITIVE_NAME}[\w-]*"
    r"(?<!-file)(?<!_file)(?<!-path)(?<!_path)(?<!-dir)(?<!_dir)(?:=|[ \t]+))"
    r"(?P<value>[^\s=]\S*)")
_SPACED = re.compile(r"(?im)(?P<key>^\s*(?:machine\s+\S+\s+)?(?:login\s+\S+\s+)?"
                     r"(?:password|passwd|passphrase)[ \t]+)(?P<value>[^\s=:]\S*)")
_AUTHORIZATION = re.compile(
    r"(?i)(?P<key>\bauthorization\s*[:=]\s*(?:(?:bearer|basic|token|digest)\s+)?)"
    r"(?P<value>\S+)")
_URL_CREDENTIALS = re.compile(
    r"(?i)(?P<key>\b[a-z][a-z0-9+.-]*://(?:[^\s/@:]+:)?)(?P<value>[^\s/@]+)(?=@)")
_PRIVATE_KEY = re.compile(
    r"(?P<key>-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----)(?P<value>.*?)(?=-----END [A-Z0-9 ]*"
    r"PRIVATE KEY-----|\Z)", re.DOTALL)

# Text none of the patterns above can match lacks all of these (each pattern needs one).
_TRIGGER = re.compile(rf"(?i){SENSITIVE_NAME}|authorization|://|-----BEGIN")

_MEMO_TEXTS = 16384  # texts a redaction remembers, each at most _MEMO_LENGTH long
_MEMO_LENGTH = 256


class _Redaction:
    """The secret values remembered when it was made, longest first, and what it made of
    the (short) texts it has redacted."""

    __slots__ = ("done", "secrets")

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self.secrets = secrets
        self.done: dict[str, str] = {}


_lock = threading.Lock()
_known: set[str] = set()
_current: list[_Redaction | None] = [_Redaction(())]  # None: a secret was remembered since


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """Whether a variable of this name holds a secret (``ansible_become_password``,
    ``db_pass``, ``GITHUB_PAT``, ``PASSPHRASE``...) rather than where one is kept
    (``..._file``, ``..._path``)."""
    return bool(_NAME.search(name)) and not _NOT_SECRET.search(name)


def holds_secret(name: str, value: object) -> bool:
    """Whether ``name`` is a secret's name or ``value`` has one among its keys (an
    environment mapping with ``HF_TOKEN`` in it)."""
    if is_secret_name(name):
        return True
    if isinstance(value, dict):
        return any(holds_secret(str(key), item) for key, item in value.items())
    if isinstance(value, list):
        return any(holds_secret("", item) for item in value)
    return False


def remember_secret(name: str, value: object, secret: bool = False) -> None:
    """Remember ``value`` for redaction if ``name`` is a secret's name (or ``secret``:
    the value sits under one), and so every value of a mapping under a secret's name."""
    secret = secret or is_secret_name(name)
    if isinstance(value, dict):
        for key, item in value.items():
            remember_secret(str(key), item, secret)
    elif isinstance(value, list):
        for item in value:
            remember_secret("", item, secret)
    elif secret and not isinstance(value, bool) and isinstance(value, (str, int, float)) \
            and len(str(value)) >= _MIN_LENGTH:
        text = str(value)
        with _lock:
            if text not in _known:
                _known.add(text)
                _current[0] = None


def known_secrets() -> frozenset[str]:
    """Every secret value remembered so far."""
    with _lock:
        return frozenset(_known)


def _masked(match: re.Match[str]) -> str:
    return match["key"] + MASK


def _masked_block(match: re.Match[str]) -> str:
    return match["key"] + f"\n{MASK}\n"


def redact(text: str) -> str:
    """Replace secrets with asterisks: values of secret-looking keys (``*_PASS``, ``TOKEN``,
    ``PASSPHRASE``, ``*_PAT``, ``PRIVATE_KEY``...) and options, ``Authorization`` headers,
    credentials in URLs (``https://user:token@host``), private key blocks, and every
    secret value an inventory holds wherever it appears (a bare password on a line)."""
    redaction = _current[0] or _redaction()
    memo = type(text) is str and len(text) <= _MEMO_LENGTH
    if memo and text in redaction.done:
        return redaction.done[text]
    redacted = text
    if _TRIGGER.search(redacted):
        redacted = _PRIVATE_KEY.sub(_masked_block, redacted)
        for pattern in (_KEY_VALUE, _OPTION, _SPACED, _AUTHORIZATION, _URL_CREDENTIALS):
            redacted = pattern.sub(_masked, redacted)
    for secret in redaction.secrets:
        redacted = redacted.replace(secret, MASK)
    if memo and len(redaction.done) < _MEMO_TEXTS:
        redaction.done[text] = redacted
    return redacted


def _redaction() -> _Redaction:
    """The redaction of the secret values remembered so far (a new one after a secret is
    remembered, so what an older one remembers is never used again)."""
    with _lock:
        current = _current[0]
        if current is None:
            current = _current[0] = _Redaction(tuple(sorted(_known, key=len, reverse=True)))
        return current
