"""Default values of sglang's environment variables, read from the release's own source.

From 0.5.x sglang declares its settings in ``sglang/srt/environ.py`` as class attributes
(``SGLANG_DISAGGREGATION_QUEUE_SIZE = EnvInt(4)``); older code calls
``get_int_env_var("NAME", 4)`` / ``get_bool_env_var("NAME", "false")`` / ``os.getenv``
at the use site. Both forms are read here; a default that is not a literal (a callable,
``EnvInt(None)``) is recorded as unknown, never guessed.
"""

from __future__ import annotations

import ast
from pathlib import Path

from forensics.sglang_source import verified_read_bytes

UNKNOWN = object()  # a default that is not a literal

_ENV_CLASSES = {"EnvInt": int, "EnvBool": bool, "EnvStr": str, "EnvFloat": float}


def _convert(kind: type, value: object) -> object:
    if value is None:
        return None
    if kind is bool:
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "y", "on")
        return bool(value)
    try:
        return kind(value)  # type: ignore[call-arg]
    except (TypeError, ValueError):
        return UNKNOWN


def env_kind(call_name: str) -> type | None:
    """``EnvInt`` -> int, ``EnvBoolWithAlias`` -> bool, ``get_int_env_var`` -> int ..."""
    for prefix, kind in _ENV_CLASSES.items():
        if call_name.startswith(prefix):
            return kind
    lowered = call_name.lower()
    if "bool" in lowered:
        return bool
    if "int" in lowered:
        return int
    if "float" in lowered:
        return float
    return None


def read_environ(srt: Path) -> dict[str, object]:
    """``NAME -> default`` for every ``NAME = Env*(default, ...)`` in ``sglang/srt/environ.py``."""
    path = srt / "environ.py"
    try:
        tree = ast.parse(verified_read_bytes(path).decode("utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return {}
    defaults: dict[str, object] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            continue
        kind = env_kind(call.func.id) if call.func.id.startswith("Env") else None
        if kind is None:
            continue
        if call.args and isinstance(call.args[0], ast.Constant):
            defaults[node.targets[0].id] = _convert(kind, call.args[0].value)
        else:
            defaults[node.targets[0].id] = UNKNOWN
    return defaults


def call_site_default(call: ast.Call) -> tuple[str, object] | None:
    """``get_int_env_var("NAME", 4)``, ``os.getenv("NAME", "4")``: the name and its default."""
    func = ast.unparse(call.func)
    if not call.args or not isinstance(call.args[0], ast.Constant) or not isinstance(call.args[0].value, str):
        return None
    name = call.args[0].value
    if not name.startswith("SGLANG"):
        return None
    default: object = None
    if len(call.args) > 1:
        default = call.args[1].value if isinstance(call.args[1], ast.Constant) else UNKNOWN
    kind = env_kind(func.split(".")[-1])
    if func in ("os.getenv", "os.environ.get", "getenv"):
        return name, default  # a string; the use site converts it
    if kind is None:
        return None
    return name, _convert(kind, default) if default is not UNKNOWN else UNKNOWN
