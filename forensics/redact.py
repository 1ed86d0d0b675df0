"""Secrets are redacted when they are collected, so nothing downstream can leak them.

Every collector that reads something a secret can hide in (a command line, a process
environment, an engine's server args) passes it through this module before building its
result: the key stays, the value becomes :data:`REDACTED`, so a reader knows something was
there without seeing it. The rules (docs/settings.md):

* **names**: an environment variable, server arg, JSON key, query parameter or command-line
  flag whose name looks secret (:func:`is_secret_name`: api_key, apikey, token, secret,
  password, passwd, auth, credential, private_key, access_key ..., any case, any separator,
  camelCase too) keeps its name and loses its value;
* **text**: anywhere in free text, ``Authorization:`` header values, ``Bearer <token>``,
  ``Basic <base64>``, a URL's userinfo (``http://<redacted>@host``; for ssh:// only the
  password: ``ssh://ops:<redacted>@host``),
  secret-named query parameters, ``NAME=value`` / ``--name=value`` / ``--name value`` pairs
  with a secret name, and values shaped like well-known tokens (``hf_...``, ``sk-...``,
  ``AKIA...``, ``ghp_...``, ``xox?-...``) whatever their key;
* **structures**: :func:`redact_argv` (argv lists, ``--api-key X`` and ``--api-key=X``),
  :func:`redact_env` (mappings of environment variables), :func:`redact_value` (nested
  JSON: dicts, lists, strings).

``None``, ``False`` and empty values of secret names are kept as they are: they say "not
set", which is worth knowing and hides nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "REDACTED",
    "is_secret_name",
    "redact_argv",
    "redact_env",
    "redact_text",
    "redact_url",
    "redact_value",
]

REDACTED = "<redacted>"

# The one table of what is secret: every collector, the gap and command records and the
# bundle ask :func:`is_secret_name`, which reads only this table (docs/settings.md lists it).
# A name is split on separators and camelCase into lowercase words first.
SECRET_NAMES: dict[str, frozenset] = {
    # a word that marks a secret wherever it stands in the name
    "words": frozenset({
        "secret", "secrets", "password", "passwd", "pwd", "passphrase", "auth", "authorization",
        "credential", "credentials", "apikey", "cookie", "sessionid", "bearer",
    }),
    # a word that marks a secret only as the name's last word: HF_TOKEN, access_token and
    # --token hold one, but sglang's numeric settings token_capacity, ds_heavy_token_num and
    # tbo_token_distribution_threshold only name a count of tokens
    "last_words": frozenset({"token"}),
    # adjacent word pairs ("api key", "private key", ...)
    "pairs": frozenset({
        ("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"), ("client", "secret"),
        ("signing", "key"), ("encryption", "key"), ("master", "key"), ("account", "key"), ("service", "key"),
    }),
    # substrings of the name with its separators removed: glued forms such as OPENAI_APIKEY
    "glued": frozenset({"apikey", "password", "passwd", "secret", "credential", "privatekey", "accesskey"}),
}
# glued forms ending the name (HFAUTHTOKEN, "accesstoken"): "token" at the end again
_GLUED_LAST = ("authtoken", "accesstoken", "bearertoken", "apitoken", "hftoken")

# sglang's server arguments, classified once: the ``ServerArgs`` fields of every release from 0.5.1
# to 0.5.23 (617 names, read from each release's ``server_args.py`` or, from 0.5.21,
# ``arg_groups/fields/``) whose class the name rules above would get wrong, or that are secrets
# whatever the rules say. A field, a ``--flag`` or a /server_info key of these names is decided
# here; every other field is decided by the rules (tests/test_server_args_redaction.py checks all
# 617 against its own list).
SERVER_ARGS: dict[str, frozenset] = {
    # the keys of sglang's HTTP API, the SSL key's passphrase, and the text watermark's keys and
    # config (sglang 0.5.22+ hides these three from ServerArgs' own repr)
    "secret": frozenset({"api_key", "admin_api_key", "ssl_keyfile_password", "watermark_key", "watermark_key_b",
                         "watermark_config"}),
    # histogram buckets and a count per token: "token" is their last word, not a credential
    "not_secret": frozenset({"bucket_time_to_first_token", "kt_max_deferred_experts_per_token"}),
}

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SPLIT = re.compile(r"[^A-Za-z0-9]+")


def _words(name: str) -> list[str]:
    return [w.lower() for part in _SPLIT.split(name) for w in _CAMEL.split(part) if w]


def is_secret_name(name: str) -> bool:
    """Whether a key, variable, parameter or flag name looks like it holds a secret.

    ``HF_TOKEN``, ``--api-key``, ``apiKey``, ``admin_api_key``, ``AWS_SECRET_ACCESS_KEY``,
    ``db.password`` are; ``max_total_tokens``, ``tokenizer_path``, ``author``, ``token_capacity``
    and ``ds_heavy_token_num`` are not. sglang's server arguments are looked up in
    :data:`SERVER_ARGS` first (``--watermark-key`` is a secret the rules alone miss).
    """
    if not isinstance(name, str) or not name:
        return False
    as_field = name.lstrip("-").replace("-", "_").lower()
    if as_field in SERVER_ARGS["secret"]:
        return True
    if as_field in SERVER_ARGS["not_secret"]:
        return False
    words = _words(name)
    if not words:
        return False
    if any(w in SECRET_NAMES["words"] for w in words) or words[-1] in SECRET_NAMES["last_words"]:
        return True
    if any(pair in SECRET_NAMES["pairs"] for pair in zip(words, words[1:])):
        return True
    glued = "".join(words)
    return any(s in glued for s in SECRET_NAMES["glued"]) or glued.endswith(_GLUED_LAST)


def _keep_as_is(value: Any) -> bool:
    """Values that say "not set" and hide nothing: None, booleans, empty strings and containers."""
    return value is None or isinstance(value, bool) or (isinstance(value, (str, bytes, list, tuple, dict)) and not value)


# ---------------------------------------------------------------------------------------- text

_NAME = r"[A-Za-z_][A-Za-z0-9_.\-]*"
_AUTH_HEADER = re.compile(
    r"(?i)(\b(?:proxy-)?authorization\b[\"']?\s*[:=]\s*[\"']?)((?:bearer|basic|token|digest|negotiate)\s+)?"
    r"([^\s\"',;]+)"
)
_BEARER = re.compile(r"(?i)(\bbearer\s+)([A-Za-z0-9._~+/=\-]{6,})")
_BASIC = re.compile(r"(\bBasic\s+)([A-Za-z0-9+/]{6,}={0,2})")
# The password of a URL's userinfo (ssh://ops:<redacted>@host keeps the login name the reader
# needs); in any other scheme the whole userinfo, since a token is as often the user
# (https://TOKEN@host, https://TOKEN:x-oauth-basic@github.com) as the password.
_URL_USERINFO = re.compile(r"(?i)\b((?:ssh|sftp)://[^/\s:@?#]*:)([^/\s@?#]+)(@)")
_URL_ANY_USERINFO = re.compile(r"(?i)\b((?!ssh://|sftp://)[a-z][a-z0-9+.\-]*://)([^/\s@?#<>]+)(@)")
_QUERY = re.compile(r"([?&;])([^=&#\s]+)=([^&#\s\"']*)")
# NAME=value, --name=value, "name": "value", name: value (the value up to a separator).
_ASSIGN = re.compile(
    r"(?<![A-Za-z0-9_.\-])(-{0,2}[\"']?)(" + _NAME + r")([\"']?\s*(?:=|:\s*)\s*)"
    r"(\"[^\"]*\"|'[^']*'|[^\s,;&}\]\"']+)"
)
# --name value (a flag with a secret name followed by its value).
_FLAG_SPACE = re.compile(r"(?<![A-Za-z0-9_])(--?" + _NAME + r")(\s+)(\"[^\"]*\"|'[^']*'|[^\s\-][^\s]*)")
_TOKEN_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-(?:proj-|ant-)?[A-Za-z0-9_\-]{20,}|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|xox[abprs]-[A-Za-z0-9\-]{10,}"
    r"|glpat-[A-Za-z0-9_\-]{20,})"
)


_HEADER_NAMES = ("authorization", "proxy-authorization")  # their values: _AUTH_HEADER (keeps the scheme)


def redact_url(url: str) -> str:
    """The URL with its userinfo (for ssh://, the password) and secret-named query values redacted."""
    return redact_text(url)


def _quoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[0] + REDACTED + value[0]
    secret, closers = _split_closers(value)
    return REDACTED + closers if secret else value


_OPENER_OF = {")": "(", "]": "[", "}": "{"}


def _split_closers(value: str) -> tuple[str, str]:
    """``value`` as (secret, closing brackets after it that close something opened before it).

    An unquoted value runs up to whitespace, so in ``f(token=abc)`` or ``(Bearer: abc)`` the
    match takes the ``)`` that closes the text around it; redacting it whole would eat that
    bracket. A closer the value itself opened (``pass(1)``) stays part of the secret.
    """
    end = len(value)
    while end and value[end - 1] in _OPENER_OF:
        closer = value[end - 1]
        if value.count(closer, 0, end) <= value.count(_OPENER_OF[closer], 0, end):
            break
        end -= 1
    return value[:end], value[end:]


def _sub_pairs(pattern: re.Pattern, text: str, secret, replace) -> str:
    """``pattern.sub`` over (name, separator, value) matches that resumes after the separator of a non-secret one.

    In ``KVTransferError: retry(token=abc)`` the pair ``KVTransferError: retry(token=abc)``
    matches first; its name is not secret, and a plain ``sub`` would skip its whole value,
    hiding the ``token=abc`` inside it from the next match. The value of an innocent pair is
    searched again instead.
    """
    out: list[str] = []
    pos = 0
    while (m := pattern.search(text, pos)) is not None:
        if secret(m):
            out.append(text[pos:m.start()] + replace(m))
            pos = m.end()
        else:
            resume = m.start(m.lastindex)  # the value's first character: search it again
            out.append(text[pos:resume])
            pos = resume
    out.append(text[pos:])
    return "".join(out)


# Every rule but the token shapes needs one of these in the lowercased text: each secret word,
# last word, pair and glued form of SECRET_NAMES holds one (api key: "api"; private key: "key"),
# as do the header rules (authorization, bearer, basic). A log line with none of them (most
# of a large log's events) costs one pass of ``in`` checks instead of every regex. So does each
# name of SERVER_ARGS["secret"] ("watermark_config": "watermark").
_HINTS = ("secret", "pass", "pwd", "auth", "credential", "api", "cookie", "session", "bearer", "token", "key",
          "basic", "watermark")


# What each of _TOKEN_SHAPES starts with (it is case-sensitive too).
_SHAPE_HINTS = ("hf_", "sk-", "AKIA", "ASIA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xox", "glpat-")


def _may_hold_named_secret(text: str) -> bool:
    if "@" in text and "://" in text:
        return True
    lowered = text.lower()
    return any(hint in lowered for hint in _HINTS)


def redact_text(text: str) -> str:
    """Free text with every secret the rules above can see replaced by :data:`REDACTED`."""
    if not isinstance(text, str) or not text:
        return text
    if not _may_hold_named_secret(text):
        return _TOKEN_SHAPES.sub(REDACTED, text) if any(h in text for h in _SHAPE_HINTS) else text
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + (m.group(2) or "") + _quoted(m.group(3)), text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED if m.group(2) != REDACTED else m.group(0), text)
    text = _BASIC.sub(lambda m: m.group(1) + REDACTED, text)
    text = _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    text = _URL_ANY_USERINFO.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    text = _QUERY.sub(
        lambda m: m.group(1) + m.group(2) + "=" + _quoted(m.group(3)) if is_secret_name(m.group(2)) and m.group(3)
        else m.group(0),
        text,
    )
    text = _sub_pairs(_ASSIGN, text, lambda m: is_secret_name(m.group(2)) and m.group(2).lower() not in _HEADER_NAMES,
                      lambda m: m.group(1) + m.group(2) + m.group(3) + _quoted(m.group(4)))
    text = _sub_pairs(_FLAG_SPACE, text, lambda m: is_secret_name(m.group(1).lstrip("-")) and "=" not in m.group(1),
                      lambda m: m.group(1) + m.group(2) + _quoted(m.group(3)))
    return _TOKEN_SHAPES.sub(REDACTED, text)


# ----------------------------------------------------------------------------------- structures


def redact_argv(argv: Sequence[str]) -> list[str]:
    """An argument list with ``--secret value``, ``--secret=value`` and secrets in text redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next:
            hide_next = False
            if not arg.startswith("-") or arg == "-":
                out.append(REDACTED)
                continue
        if arg.startswith("-") and len(arg) > 1:
            name, eq, value = arg.partition("=")
            if is_secret_name(name.lstrip("-")):
                if eq:
                    out.append(f"{name}={REDACTED}" if value else arg)
                else:
                    out.append(arg)
                    hide_next = True
                continue
        name, eq, value = arg.partition("=")
        if eq and value and _NAME_RE.fullmatch(name) and is_secret_name(name):
            out.append(f"{name}={REDACTED}")  # NAME=value, as `env NAME=value cmd` passes it
            continue
        out.append(redact_text(arg))
    return out


_NAME_RE = re.compile(_NAME)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment variables: secret names keep their name with :data:`REDACTED`; other values pass through :func:`redact_text`."""
    return {
        name: (value if _keep_as_is(value) else REDACTED) if is_secret_name(name) else redact_text(value)
        for name, value in env.items()
    }


def redact_value(value: Any, key: str | None = None) -> Any:
    """A JSON-like value (dicts, lists, strings, numbers) with every secret redacted, recursively.

    ``key`` is the name the value is stored under, when there is one: a secret name hides
    the whole value (unless it says "not set": None, False, empty).
    """
    if key is not None and is_secret_name(str(key)) and not _keep_as_is(value):
        return REDACTED
    if isinstance(value, Mapping):
        return {k: redact_value(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    if isinstance(value, str):
        return redact_text(value)
    return value
