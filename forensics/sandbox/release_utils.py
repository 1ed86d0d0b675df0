"""A few pure helpers of a release's ``sglang.srt.utils``, served from the release's own source.

The sandbox stubs ``sglang.srt.utils`` as a whole: the module imports torch, CUDA probes and the
server. Up to 0.5.9 Mooncake's code takes small standard-library helpers from it: its
``MooncakeTransferEngine`` builds the engine's session id with ``maybe_wrap_ipv6_address``, and
``mooncake/conn.py`` formats the decode's PUSH endpoint with ``format_tcp_address`` and reads its
queue sizes and timeouts with ``get_int_env_var``. (From 0.5.10 both use
``sglang.srt.utils.network``, which the shim loads for real.) A stub there puts
``<sandbox stub ...>`` into a session id or a ZMQ endpoint, and no transfer finds its peer.

These helpers need nothing but the standard library, so the sandbox does not stand in for them:
:func:`release_helpers` compiles the release's own definitions out of its utils file
(``sglang/srt/utils.py`` up to 0.5.3, ``sglang/srt/utils/common.py`` from 0.5.4), with that file's
name and line numbers, together with exactly the module-level names they use (other helpers of
the same file, standard-library imports, simple assignments such as ``logger``). Anything else a
helper reaches for is refused with :class:`SandboxError` naming it, never guessed.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import sys
from functools import cache
from pathlib import Path

from forensics.sandbox.errors import SandboxError
from forensics.sandbox.stubs import Stub
from forensics.sglang_source import verified_read_text

# The helpers served: pure functions of their arguments, the environment and the socket module.
RELEASE_HELPERS = (
    "maybe_wrap_ipv6_address",
    "is_valid_ipv6_address",
    "format_tcp_address",
    "get_free_port",
    "get_bool_env_var",
    "get_int_env_var",
)
UTILS_FILES = ("sglang/srt/utils/common.py", "sglang/srt/utils.py")
STUBBED_MODULE = "sglang.srt.utils"


def utils_file(sglang_root: str | Path) -> Path:
    """The file of the release that defines ``sglang.srt.utils``'s helpers."""
    for relative in UTILS_FILES:
        path = Path(sglang_root) / relative
        if path.is_file():
            return path
    raise SandboxError(f"{sglang_root}: neither {' nor '.join(UTILS_FILES)} exists")


def _top_level(tree: ast.Module) -> dict[str, ast.stmt]:
    """Each module-level name and the first statement that binds it (def, import, assignment)."""
    bound: dict[str, ast.stmt] = {}
    for stmt in tree.body:
        names: list[str] = []
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            names = [stmt.name]
        elif isinstance(stmt, ast.Import):
            names = [alias.asname or alias.name.split(".")[0] for alias in stmt.names]
        elif isinstance(stmt, ast.ImportFrom):
            names = [alias.asname or alias.name for alias in stmt.names]
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names = [node.id for target in targets for node in ast.walk(target) if isinstance(node, ast.Name)]
        for name in names:
            bound.setdefault(name, stmt)
    return bound


def _free_names(stmt: ast.stmt) -> set[str]:
    """Names ``stmt`` reads that it does not bind itself (annotations excluded: they stay strings)."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return set()
    annotations = set()
    for node in ast.walk(stmt):
        for field in ("annotation", "returns"):
            value = getattr(node, field, None)
            if isinstance(value, ast.AST):
                annotations.update(id(inner) for inner in ast.walk(value))
    read, local = set(), set()
    for node in ast.walk(stmt):
        if id(node) in annotations:
            continue
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else local).add(node.id)
        elif isinstance(node, ast.arg):
            local.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            local.add(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not stmt:
            local.add(node.name)
    if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
        local.discard(stmt.name)  # recursion reads the module-level name
    return read - local


def _standard_library_import(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Import):
        return all(alias.name.split(".")[0] in sys.stdlib_module_names for alias in stmt.names)
    if isinstance(stmt, ast.ImportFrom):
        return stmt.level == 0 and (stmt.module or "").split(".")[0] in sys.stdlib_module_names
    return False


@cache
def _compiled(path: str, names: tuple[str, ...]) -> dict:
    text = verified_read_text(path)  # a cached release's file: checked against its recorded sha256
    tree = ast.parse(text, filename=path)
    top = _top_level(tree)
    needed: dict[int, ast.stmt] = {}
    pending = list(names)
    while pending:
        name = pending.pop()
        stmt = top.get(name)
        if stmt is None:
            if hasattr(builtins, name) or name == "__name__":
                continue
            raise SandboxError(f"{path}: defines no module-level {name!r} (wanted for {', '.join(names)})")
        if id(stmt) in needed:
            continue
        if isinstance(stmt, (ast.Import, ast.ImportFrom)) and not _standard_library_import(stmt):
            raise SandboxError(f"{path}:{stmt.lineno}: {name!r}, used by the helpers {', '.join(names)}, comes from "
                               f"{ast.unparse(stmt)!r}, which is not the standard library; the sandbox serves only "
                               "standard-library helpers from the release")
        if isinstance(stmt, ast.ClassDef) or getattr(stmt, "decorator_list", None):
            raise SandboxError(f"{path}:{stmt.lineno}: {name!r} is a class or a decorated function; the sandbox "
                               "serves only plain helper functions from the release")
        needed[id(stmt)] = stmt
        pending.extend(_free_names(stmt) - {name})
    module = ast.Module(body=sorted(needed.values(), key=lambda s: s.lineno), type_ignores=[])
    # Annotations stay unevaluated (as under ``from __future__ import annotations``): they may
    # name typing or torch objects the helpers never touch.
    code = compile(module, path, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace: dict = {"__name__": STUBBED_MODULE, "__file__": path}
    exec(code, namespace)  # noqa: S102 - the release's own definitions, from its verified file
    return {name: namespace[name] for name in names}


def release_helpers(sglang_root: str | Path, names=RELEASE_HELPERS) -> dict:
    """``{name: function}``: the release's own definitions of ``names`` (from :data:`RELEASE_HELPERS`)."""
    unknown = sorted(set(names) - set(RELEASE_HELPERS))
    if unknown:
        raise SandboxError(f"not a helper the sandbox serves from a release: {', '.join(unknown)}")
    return _compiled(str(utils_file(sglang_root)), tuple(sorted(set(names))))


def serve_release_helpers(module_globals: dict, sglang_root: str | Path) -> list[str]:
    """Where a release module imported one of :data:`RELEASE_HELPERS` from the stubbed
    ``sglang.srt.utils``, put the release's own helper in its place; returns the names replaced."""
    stubbed = sorted(
        name for name in RELEASE_HELPERS
        if isinstance(module_globals.get(name), Stub)
        and module_globals[name]._stub_path == f"{STUBBED_MODULE}.{name}"
    )
    if stubbed:
        module_globals.update(release_helpers(sglang_root, stubbed))
    return stubbed
