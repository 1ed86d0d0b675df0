"""Every ``ServerArgs`` field of every release, redacted or kept, against this file's own list.

The fields are read from each release's source (``server_args.py``, or from 0.5.21 the namespace
structs of ``arg_groups/fields/``). What is secret is written out here, not asked of the classifier
under test: the keys of sglang's HTTP API, the SSL key's passphrase and the text watermark's keys
and config. Every other field is a number, a path, a name or a switch, and must come through
unchanged in each form it travels in: a ``/server_info`` body, a command line, a log line.
"""

from __future__ import annotations

from functools import cache

import pytest
from sglang_releases import EVERY_RELEASE

from forensics import sglang_source
from forensics.redact import REDACTED, redact_argv, redact_text, redact_value
from forensics.twin.endpoints import server_arg_fields

SECRET_FIELDS = frozenset({"api_key", "admin_api_key", "ssl_keyfile_password", "watermark_key", "watermark_key_b",
                           "watermark_config"})


@cache
def fields_of(version: str) -> dict:
    fields = server_arg_fields(sglang_source.fetch(version).root)
    assert len(fields) > 100, f"{version}: only {len(fields)} ServerArgs fields read"
    return fields


def a_value(name: str, default) -> str | int | float:
    """What a deployment could set the field to: its default when that says something, else a plain word."""
    if isinstance(default, int | float) and not isinstance(default, bool):
        return default
    if isinstance(default, str) and default and " " not in default:
        return default
    return f"set-{name.replace('_', '-')}"


def as_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize("version", EVERY_RELEASE)
def test_each_server_arg_is_kept_or_redacted_as_the_list_says(version):
    fields = fields_of(version)
    wrong = []
    for name, default in sorted(fields.items()):
        value = a_value(name, default)
        secret = name in SECRET_FIELDS
        body = redact_value({"server_args": {name: value}, name: value})
        argv = redact_argv(["python", "-m", "sglang.launch_server", as_flag(name), str(value)])
        inline = redact_argv([f"{as_flag(name)}={value}"])
        line = redact_text(f"server_args={name}={value} ready")
        if secret:
            kept = [form for form, out in (("/server_info", body[name]), ("nested", body["server_args"][name]),
                                           ("argv", argv[-1]), ("--flag=value", inline[0].partition("=")[2]))
                    if out != REDACTED]
            if str(value) in line:
                kept.append("log line")
            if kept:
                wrong.append(f"{name}: a secret, kept in {', '.join(kept)}")
        else:
            changed = [form for form, out, want in (
                ("/server_info", body[name], value), ("nested", body["server_args"][name], value),
                ("argv", argv[-1], str(value)), ("--flag=value", inline[0], f"{as_flag(name)}={value}"),
                ("log line", line, f"server_args={name}={value} ready")) if out != want]
            if changed:
                wrong.append(f"{name} = {value!r}: not a secret, changed in {', '.join(changed)}")
    assert not wrong, f"sglang {version}: " + "; ".join(wrong)


def test_the_list_names_fields_that_exist():
    """Each secret of the list is a field of some release (a renamed field would leave a dead entry)."""
    seen = set().union(*(fields_of(v) for v in ("0.5.15", "0.5.23")))
    assert {"api_key", "admin_api_key", "ssl_keyfile_password"} <= seen
    assert {"watermark_key", "watermark_key_b", "watermark_config"} <= set(fields_of("0.5.23"))


@pytest.mark.parametrize("text", [
    "GET /v1/models?token=hunter2-value HTTP/1.1",
    "connecting with token=hunter2-value",
    "retry(token=hunter2-value)",
    "--token hunter2-value",
])
def test_a_token_in_a_log_line_or_a_query_stays_redacted(text):
    out = redact_text(text)
    assert "hunter2-value" not in out and REDACTED in out, out
