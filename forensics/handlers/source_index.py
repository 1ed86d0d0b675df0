"""An ``ast`` index of one release's disaggregation package: files, classes, methods, constants.

Everything the handler map needs to look up by name lives here: which file defines a
class, its bases (for inheritance: ascend's manager is a Mooncake manager), a method
found through that inheritance, the value of a tag constant (``GUARD``, ``ABORT_TAG``,
``MooncakeKVManager.AUX_DATA_HEADER``) wherever it was defined or imported from, and
the function that encloses any node. Files that do not parse (or cannot be read) are
recorded as gaps and as :class:`~forensics.handlers.model.Unreadable` entries with their
line, never silently skipped.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from forensics.handlers.model import UNPARSEABLE, UNREADABLE_FILE, Gap, Unreadable
from forensics.sglang_source import verified_read_bytes

SHARED_DIRS = ("common", "base")
PACKAGE = "sglang.srt.disaggregation"


@dataclass
class ParsedFile:
    relpath: str  # relative to the disaggregation directory, e.g. "nixl/conn.py"
    path: Path
    text: str
    tree: ast.Module
    lines: list[str]
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)
    constants: dict[str, object] = field(default_factory=dict)
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)  # local name -> (module, name)

    def segment(self, first: int, last: int) -> str:
        return "\n".join(self.lines[first - 1 : last])


@dataclass
class ClassInfo:
    name: str
    file: ParsedFile
    node: ast.ClassDef
    bases: list[str]
    attributes: dict[str, ast.expr]
    methods: dict[str, ast.FunctionDef]
    instance_attributes: set[str] = field(default_factory=set)  # assigned as self.X somewhere


def _literal(node: ast.expr) -> object | None:
    """A bytes/str constant, including ``"X".encode("ascii")`` and ``b"X"``; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, bytes | str):
        return node.value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "encode"
        and isinstance(node.func.value, ast.Constant)
        and isinstance(node.func.value.value, str)
    ):
        return node.func.value.value.encode()
    return None


def _module_to_relpath(module: str) -> str | None:
    if not module.startswith(PACKAGE + "."):
        return None
    rest = module[len(PACKAGE) + 1 :].replace(".", "/")
    return rest + ".py"


class SourceIndex:
    """Parsed disaggregation sources of one release, with name lookups across files."""

    def __init__(self, disaggregation: Path) -> None:
        self.root = disaggregation
        self.files: dict[str, ParsedFile] = {}
        self.classes: dict[str, ClassInfo] = {}
        self.classes_by_name: dict[str, list[ClassInfo]] = {}
        # name -> calls of it (``x.name(...)``, ``name(...)``, ``Thread(target=...name)``), built once
        self.calls_by_name: dict[str, list[tuple[ast.Call, ParsedFile]]] = {}
        self.target_refs: dict[str, list[tuple[ast.Call, ParsedFile]]] = {}
        self._class_of: dict[int, ClassInfo | None] = {}
        self.gaps: list[Gap] = []
        self.unreadable: list[Unreadable] = []  # files that could not be read or parsed, with the line

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, disaggregation: Path, backends: list[str]) -> SourceIndex:
        index = cls(disaggregation)
        candidates: list[Path] = []
        for backend in backends:
            candidates.append(disaggregation / backend / "conn.py")
        for shared in SHARED_DIRS:
            directory = disaggregation / shared
            if directory.is_dir():
                candidates.extend(sorted(directory.glob("*.py")))
        for path in candidates:
            index._add(path)
        return index

    def _unreadable(self, relpath: str, path: Path, looked_for: str, reason: str, line: int | None,
                    kind: str) -> None:
        self.gaps.append(Gap(relpath, looked_for, reason))
        directory = relpath.split("/")[0]
        backend = None if directory in SHARED_DIRS else directory
        self.unreadable.append(Unreadable(relpath, line, backend, reason, kind, str(path)))

    def _add(self, path: Path) -> None:
        relpath = str(path.relative_to(self.root))
        try:
            # A cached release's file is checked against its recorded sha256 (restored, or exit 4).
            data = verified_read_bytes(path)
        except OSError as exc:
            self._unreadable(relpath, path, "a readable Python module",
                             f"cannot be read: {exc.strerror or exc}", None, UNREADABLE_FILE)
            return
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            self._unreadable(relpath, path, "a readable Python module",
                             f"cannot be read: not UTF-8 ({exc.reason}) at line {line}", line, UNREADABLE_FILE)
            return
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError as exc:  # IndentationError and TabError too
            line = exc.lineno or 1
            self._unreadable(relpath, path, "a parseable Python module",
                             f"does not parse: {exc.msg} at line {line}", line, UNPARSEABLE)
            return
        except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, nesting too deep for the parser
            line = text[: text.index("\0")].count("\n") + 1 if "\0" in text else 1
            self._unreadable(relpath, path, "a parseable Python module",
                             f"does not parse: {type(exc).__name__}: {exc} at line {line}", line, UNPARSEABLE)
            return
        parsed = ParsedFile(relpath, path, text, tree, text.splitlines())
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                parsed.parents[child] = parent
            if isinstance(parent, ast.Call):
                func = parent.func
                called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
                if called:
                    self.calls_by_name.setdefault(called, []).append((parent, parsed))
                for keyword in parent.keywords:
                    if keyword.arg == "target":
                        name = ast.unparse(keyword.value).split(".")[-1]
                        self.target_refs.setdefault(name, []).append((parent, parsed))
        for statement in tree.body:
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                target = statement.targets[0]
                value = _literal(statement.value)
                if isinstance(target, ast.Name) and value is not None:
                    parsed.constants[target.id] = value
            elif isinstance(statement, ast.ImportFrom) and statement.module:
                for alias in statement.names:
                    parsed.imports[alias.asname or alias.name] = (statement.module, alias.name)
            elif isinstance(statement, ast.ClassDef):
                self._add_class(parsed, statement)
        self.files[relpath] = parsed

    def _add_class(self, parsed: ParsedFile, node: ast.ClassDef) -> None:
        bases = [ast.unparse(base).split(".")[-1] for base in node.bases]
        # In a msgspec Struct, NamedTuple or dataclass an annotated class attribute is a per-instance
        # field default (AbortNotification.decode_ip = None), not a constant of the class.
        record = any(b in ("Struct", "NamedTuple") for b in bases) or any(
            "dataclass" in ast.unparse(d) for d in node.decorator_list
        )
        attributes: dict[str, ast.expr] = {}
        methods: dict[str, ast.FunctionDef] = {}
        for statement in node.body:
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                if isinstance(statement.targets[0], ast.Name):
                    attributes[statement.targets[0].id] = statement.value
            elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and not record:
                if statement.value is not None:
                    attributes[statement.target.id] = statement.value
            elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                methods[statement.name] = statement  # type: ignore[assignment]
        assigned = {
            target.attr
            for statement in ast.walk(node)
            if isinstance(statement, ast.Assign | ast.AnnAssign | ast.AugAssign)
            for target in (statement.targets if isinstance(statement, ast.Assign) else [statement.target])
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
        }
        info = ClassInfo(node.name, parsed, node, bases, attributes, methods, assigned)
        # Several backends define their own TransferInfo / KVArgsRegisterInfo: keep them all,
        # and resolve a name from the file that uses it (``lookup_class``).
        self.classes.setdefault(node.name, info)
        self.classes_by_name.setdefault(node.name, []).append(info)

    # ------------------------------------------------------------------ lookups

    def file_of(self, node: ast.AST) -> ParsedFile:  # noqa: D102 - linear, used only on outcomes
        for parsed in self.files.values():
            if node in parsed.parents or node is parsed.tree:
                return parsed
        raise KeyError(node)

    def lookup_class(self, name: str, parsed: ParsedFile | None = None) -> ClassInfo | None:
        """The class ``name`` as seen from ``parsed``: defined there, imported there, else the first one."""
        candidates = self.classes_by_name.get(name, [])
        if not candidates:
            return None
        if parsed is not None:
            for info in candidates:
                if info.file is parsed:
                    return info
            if name in parsed.imports:
                relpath = _module_to_relpath(parsed.imports[name][0])
                for info in candidates:
                    if info.file.relpath == relpath:
                        return info
        return candidates[0]

    def mro(self, class_name: str, parsed: ParsedFile | None = None) -> list[ClassInfo]:
        """The class and its ancestors known to this index, depth first (single inheritance in sglang)."""
        order: list[ClassInfo] = []
        pending: list[tuple[str, ParsedFile | None]] = [(class_name, parsed)]
        while pending:
            name, context = pending.pop(0)
            info = self.lookup_class(name, context)
            if info is None or info in order:
                continue
            order.append(info)
            pending = [(base, info.file) for base in info.bases] + pending
        return order

    def find_method(
        self, class_name: str, method: str, parsed: ParsedFile | None = None
    ) -> tuple[ClassInfo, ast.FunctionDef] | None:
        for info in self.mro(class_name, parsed):
            if method in info.methods:
                return info, info.methods[method]
        return None

    def class_attribute(self, class_name: str, attribute: str, parsed: ParsedFile | None = None) -> object | None:
        """The constant value of a class attribute found through inheritance (None when not constant)."""
        chain = self.mro(class_name, parsed)
        if any(attribute in info.instance_attributes for info in chain):
            return None  # a class default that __init__ (or anything) overwrites is not a constant
        for info in chain:
            if attribute in info.attributes:
                node = info.attributes[attribute]
                if isinstance(node, ast.Constant) and node.value is None:
                    return NONE
                return self.constant_value(node, info.file)
        return None

    def constant_value(self, node: ast.expr, parsed: ParsedFile) -> object | None:
        """The bytes/str value of a tag expression, resolving names, imports and class attributes."""
        literal = _literal(node)
        if literal is not None:
            return literal
        if isinstance(node, ast.Name):
            return self.module_constant(parsed, node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            info = self.lookup_class(node.value.id, parsed)
            if info is not None:
                return self.class_attribute(info.name, node.attr, info.file)
        return None

    def module_constant(self, parsed: ParsedFile, name: str, depth: int = 0) -> object | None:
        if name in parsed.constants:
            return parsed.constants[name]
        if name in parsed.imports and depth < 4:
            module, original = parsed.imports[name]
            relpath = _module_to_relpath(module)
            if relpath and relpath in self.files:
                return self.module_constant(self.files[relpath], original, depth + 1)
        return None

    def enclosing(self, node: ast.AST, parsed: ParsedFile) -> list[ast.AST]:
        """Enclosing function and class definitions, innermost first."""
        chain = []
        current = parsed.parents.get(node)
        while current is not None:
            if isinstance(current, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                chain.append(current)
            current = parsed.parents.get(current)
        return chain

    def qualname(self, node: ast.AST, parsed: ParsedFile) -> str:
        names = [getattr(n, "name", "?") for n in reversed(self.enclosing(node, parsed))]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        return ".".join(names)

    def enclosing_class(self, node: ast.AST, parsed: ParsedFile) -> ClassInfo | None:
        key = id(node)
        if key not in self._class_of:
            found = None
            for outer in self.enclosing(node, parsed):
                if isinstance(outer, ast.ClassDef):
                    found = self.lookup_class(outer.name, parsed)
                    break
            self._class_of[key] = found
        return self._class_of[key]

    def functions(self) -> list[tuple[ParsedFile, ast.FunctionDef]]:
        found = []
        for parsed in self.files.values():
            for node in ast.walk(parsed.tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    found.append((parsed, node))
        return found

    def classes_in(self, relpath: str) -> list[ClassInfo]:
        return [info for infos in self.classes_by_name.values() for info in infos if info.file.relpath == relpath]


class _NoneValue:
    """A class attribute explicitly set to ``None`` (distinct from "not a constant")."""

    def __repr__(self) -> str:
        return "None"


NONE = _NoneValue()
