"""The senders of one release: every ``send_multipart`` and the frames it sends, per backend.

A send site is followed back through wrappers that take the frames as a parameter
(``_send_multipart_locked``, ``_send_bootstrap_message``) and forward into builders
(``AbortNotification(...).to_zmq()``, ``self.kv_mgr.build_receiver_registration_message()``,
resolved in each backend's own class so overrides win). Which role sends comes from the class
(``*KVReceiver`` is the decode side), the receiver loop it sits in, or its callers. The receiver
loops themselves are :mod:`forensics.handlers.source_scan`'s.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from forensics.handlers.dispatch import Const, Interpreter, State
from forensics.handlers.model import DECODE, PREFILL, Element, FrameShape, Gap, SentMessage
from forensics.handlers.source_index import ParsedFile, SourceIndex
from forensics.handlers.source_scan import CALLER_DEPTH, BackendClasses, FoundLoop, calls_to, mode_of_call


@dataclass
class SendSite:
    call: ast.Call
    frames: ast.expr
    parsed: ParsedFile
    function: ast.FunctionDef
    chain: list[str]  # wrapper functions the frames went through


def _enclosing_function(index: SourceIndex, node: ast.AST, parsed: ParsedFile) -> ast.FunctionDef | None:
    return next((n for n in index.enclosing(node, parsed) if isinstance(n, ast.FunctionDef)), None)


def _parameter_position(function: ast.FunctionDef, name: str) -> int | None:
    params = [a.arg for a in function.args.args]
    if name in params:
        position = params.index(name)
        return position - 1 if params and params[0] in ("self", "cls") else position
    if name in [a.arg for a in function.args.kwonlyargs]:
        return -1
    return None


def _assigned_in(function: ast.FunctionDef, name: str) -> bool:
    return any(
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
        for n in ast.walk(function)
    )


def find_send_sites(index: SourceIndex) -> list[SendSite]:
    pending: list[SendSite] = []
    for parsed in index.files.values():
        for node in ast.walk(parsed.tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "send_multipart":
                function = _enclosing_function(index, node, parsed)
                if function is not None and node.args:
                    pending.append(SendSite(node, node.args[0], parsed, function, []))
    sites: list[SendSite] = []
    seen: set[int] = set()
    while pending:
        site = pending.pop()
        frames = site.frames
        if (
            isinstance(frames, ast.Name)
            and not _assigned_in(site.function, frames.id)
            and len(site.chain) < 3
        ):
            position = _parameter_position(site.function, frames.id)
            if position is not None:
                # A wrapper: each call of it is the real send site.
                for call, parsed in calls_to(index, site.function.name, site.function, site.parsed):
                    if not isinstance(call, ast.Call) or id(call) in seen:
                        continue
                    argument = next((k.value for k in call.keywords if k.arg == frames.id), None)
                    if argument is None and 0 <= position < len(call.args):
                        argument = call.args[position]
                    caller = _enclosing_function(index, call, parsed)
                    if argument is not None and caller is not None:
                        seen.add(id(call))
                        pending.append(SendSite(call, argument, parsed, caller, [*site.chain, site.function.name]))
                continue
        sites.append(site)
    return sites


def _element(index: SourceIndex, node: ast.expr, parsed: ParsedFile, interpreter: Interpreter,
             function: ast.FunctionDef | None = None, depth: int = 0) -> Element:
    value = interpreter.value(node, State(FrameShape(())))
    if isinstance(node, ast.Name) and function is not None and depth < 3 and not isinstance(value, Const):
        # dst_tp_rank = str(tp_rank).encode("ascii") earlier in the builder
        for assign in ast.walk(function):
            if isinstance(assign, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in assign.targets):
                return _element(index, assign.value, parsed, interpreter, function, depth + 1)
    if isinstance(value, Const) and isinstance(value.value, bytes | str):
        raw = value.value if isinstance(value.value, bytes) else value.value.encode()
        return Element("const", raw)
    if isinstance(node, ast.IfExp):
        return _element(index, node.body, parsed, interpreter, function, depth)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "encode":
        inner = node.func.value
        if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "str":
            return Element("num")
        return Element("text")
    return Element("bytes")


class FrameResolver:
    """Turns the expression handed to ``send_multipart`` into frame shapes, in one backend's classes."""

    def __init__(self, index: SourceIndex, classes: BackendClasses) -> None:
        self.index = index
        self.classes = classes

    def resolve(self, node: ast.expr, function: ast.FunctionDef, parsed: ParsedFile, self_class: str | None,
                depth: int = 0) -> list[FrameShape]:
        interpreter = Interpreter(self.index, self_class, parsed)
        if isinstance(node, ast.List | ast.Tuple):
            return [FrameShape(tuple(_element(self.index, e, parsed, interpreter, function) for e in node.elts))]
        if depth > 3:
            return []
        if isinstance(node, ast.Name):
            shapes: list[FrameShape] = []
            for assign in ast.walk(function):
                if isinstance(assign, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == node.id for t in assign.targets
                ):
                    for shape in self.resolve(assign.value, function, parsed, self_class, depth + 1):
                        shapes.append(self._mutations(shape, function, node.id, parsed, interpreter))
            return shapes
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                owner = func.value
                target_class: str | None = None
                if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name):
                    info = self.index.lookup_class(owner.func.id, parsed)  # AbortNotification(...).to_zmq()
                    target_class = info.name if info else None
                elif isinstance(owner, ast.Attribute) and owner.attr == "kv_mgr":
                    target_class = self.classes.manager
                elif isinstance(owner, ast.Name) and owner.id == "self":
                    target_class = self_class
                elif isinstance(owner, ast.Name) and owner.id in self.index.classes:
                    target_class = owner.id
                if target_class:
                    found = self.index.find_method(target_class, func.attr)
                    if found:
                        info, method = found
                        shapes = []
                        for ret in ast.walk(method):
                            if isinstance(ret, ast.Return) and ret.value is not None:
                                shapes.extend(self.resolve(ret.value, method, info.file, target_class, depth + 1))
                        return shapes
        return []

    def _mutations(self, shape: FrameShape, function: ast.FunctionDef, name: str, parsed: ParsedFile,
                   interpreter: Interpreter) -> FrameShape:
        """``frames.extend([...])``, ``.append(x)``, ``.insert(0, tag)`` after the list was built."""
        elements = list(shape.elements)
        optional = list(shape.optional)
        for node in ast.walk(function):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == name
            ):
                continue
            condition = self._condition(node, parsed, interpreter)
            if condition is False:
                continue
            if node.func.attr == "insert" and len(node.args) == 2:
                element = _element(self.index, node.args[1], parsed, interpreter)
                if condition is True:
                    elements.insert(0, element)
                else:
                    optional.append(element)
            elif node.func.attr == "append" and node.args:
                optional.append(_element(self.index, node.args[0], parsed, interpreter))
            elif node.func.attr == "extend" and node.args and isinstance(node.args[0], ast.List | ast.Tuple):
                optional.extend(_element(self.index, e, parsed, interpreter) for e in node.args[0].elts)
        return FrameShape(tuple(elements), tuple(optional))

    def _condition(self, node: ast.AST, parsed: ParsedFile, interpreter: Interpreter) -> bool | None:
        current = parsed.parents.get(node)
        while current is not None and not isinstance(current, ast.FunctionDef):
            if isinstance(current, ast.If):
                return interpreter.test(current.test, State(FrameShape(())))
            current = parsed.parents.get(current)
        return True


def _site_conditions(site: SendSite) -> list[str]:
    """Guards on the way to the send: enclosing ifs and earlier ``if X: ... return`` exits."""
    conditions: list[str] = []
    parsed = site.parsed
    child: ast.AST = site.call
    current = parsed.parents.get(site.call)
    while current is not None and current is not site.function:
        if isinstance(current, ast.If):
            test = ast.unparse(current.test)
            conditions.append(test if child in current.body else f"not ({test})")
        child = current
        current = parsed.parents.get(current)
    for statement in site.function.body:
        if statement.lineno >= site.call.lineno:
            break
        if isinstance(statement, ast.If) and statement.body and isinstance(statement.body[-1], ast.Return):
            conditions.append(f"not ({ast.unparse(statement.test)})")
    return [c if len(c) < 120 else c[:117] + "..." for c in conditions]


def _direct_role(index: SourceIndex, function: ast.FunctionDef, parsed: ParsedFile,
                 loops: list[FoundLoop]) -> str | None:
    owner = index.enclosing_class(function, parsed)
    if owner is not None:
        names = [info.name for info in index.mro(owner.name, owner.file)]
        if any(n.endswith("Receiver") for n in names) or owner.name.startswith("Decode"):
            return DECODE
        if any(n.endswith("Sender") for n in names) or owner.name.startswith("Prefill"):
            return PREFILL
    for loop in loops:
        scope = loop.starter or loop.code.function
        if loop.role and (function is scope or _inside(parsed, function, scope)):
            return loop.role
    return None


def _inside(parsed: ParsedFile, node: ast.AST, scope: ast.AST) -> bool:
    current = parsed.parents.get(node)
    while current is not None:
        if current is scope:
            return True
        current = parsed.parents.get(current)
    return False


def sender_role(index: SourceIndex, function: ast.FunctionDef, parsed: ParsedFile,
                loops: list[FoundLoop]) -> set[str]:
    """Which role runs this function: its class, the loop it sits in, else its nearest callers.

    Callers are searched breadth first and the nearest level that says anything wins, so a
    status sender called by ``CommonKVSender.clear`` is the prefill's even if a shared recv
    wrapper two levels further up is used by both roles.
    """
    direct = _direct_role(index, function, parsed, loops)
    if direct:
        return {direct}
    level = [(function, parsed)]
    seen = {id(function)}
    for _ in range(CALLER_DEPTH):
        roles: set[str] = set()
        next_level = []
        for current, current_file in level:
            for call, caller_file in calls_to(index, current.name, current, current_file):
                mode = mode_of_call(index, call, caller_file)
                if mode:
                    roles.add(mode)
                    continue
                caller = _enclosing_function(index, call, caller_file)
                if caller is None or id(caller) in seen:
                    continue
                seen.add(id(caller))
                role = _direct_role(index, caller, caller_file, loops)
                if role:
                    roles.add(role)
                else:
                    next_level.append((caller, caller_file))
        if roles:
            return roles
        level = next_level
        if not level:
            break
    lowered = function.name.lower()
    if "to_decode" in lowered or "notify_decode" in lowered:
        return {PREFILL}
    return set()


def _applies(index: SourceIndex, site: SendSite, classes: BackendClasses, backend_files: list[str]) -> str | None:
    """The backend class in whose name this send site runs, "" for module code it uses, None if it does not."""
    owner = index.enclosing_class(site.function, site.parsed)
    method = next((n for n in index.enclosing(site.call, site.parsed) if isinstance(n, ast.FunctionDef)), None)
    top_method = method
    for node in index.enclosing(site.call, site.parsed):
        if isinstance(node, ast.FunctionDef):
            top_method = node
    if owner is not None:
        concrete = classes.concrete_for(index, owner.name)
        if concrete is not None and top_method is not None:
            resolved = index.find_method(concrete, top_method.name)
            if resolved is not None and resolved[0].name == owner.name:
                return concrete
            return None
        if concrete is not None:
            return concrete
        name = owner.name
    else:
        name = top_method.name if top_method else ""
    if site.parsed.relpath in backend_files:
        return ""
    # Module code or a helper class of common/: used when the backend's file names it.
    for relpath in backend_files:
        parsed = index.files.get(relpath)
        if parsed and any(isinstance(n, ast.Name | ast.alias) and getattr(n, "id", getattr(n, "name", "")) == name
                          for n in ast.walk(parsed.tree)):
            return ""
    return None


def _reached_from(index: SourceIndex, function: ast.FunctionDef, parsed: ParsedFile, backend: str,
                  classes: BackendClasses, depth: int = 0, seen: set[int] | None = None) -> bool:
    """Shared code sends for a backend unless every caller of it lives in some other backend's file."""
    seen = seen if seen is not None else set()
    if id(function) in seen or depth > CALLER_DEPTH:
        return True
    seen.add(id(function))
    own = {backend, classes.parent_backend, "common", "base"}
    directory = parsed.relpath.split("/")[0]
    if directory not in ("common", "base"):
        return directory in own
    owner = index.enclosing_class(function, parsed)
    if owner is not None and any(
        info.file.relpath.startswith("base/") and function.name in info.methods
        for info in index.mro(owner.name, owner.file)
    ):
        return True  # part of the Base* interface (init, abort, poll...): the scheduler calls it
    callers = calls_to(index, function.name, function, parsed)
    if not callers:
        return True  # an entry point called from outside these files
    for call, caller_file in callers:
        caller_directory = caller_file.relpath.split("/")[0]
        if caller_directory in (backend, classes.parent_backend):
            return True
        if caller_directory in ("common", "base"):
            caller = _enclosing_function(index, call, caller_file)
            if caller is None or _reached_from(index, caller, caller_file, backend, classes, depth + 1, seen):
                return True
    return False


def senders_for_backend(index: SourceIndex, backend: str, classes: BackendClasses, sites: list[SendSite],
                        found_loops: list[FoundLoop], gaps: list[Gap]) -> list[SentMessage]:
    backend_files = [f"{backend}/conn.py"]
    if classes.parent_backend:
        backend_files.append(f"{classes.parent_backend}/conn.py")
    resolver = FrameResolver(index, classes)
    messages: list[SentMessage] = []
    for site in sites:
        directory = site.parsed.relpath.split("/")[0]
        if directory not in ("common", "base", backend, classes.parent_backend):
            continue
        concrete = _applies(index, site, classes, backend_files)
        if concrete is None or not _reached_from(index, site.function, site.parsed, backend, classes):
            continue
        owner = index.enclosing_class(site.function, site.parsed)
        self_class = concrete or (owner.name if owner else None)
        shapes = resolver.resolve(site.frames, site.function, site.parsed, self_class)
        if not shapes:
            gaps.append(
                Gap(site.parsed.relpath, "the frames passed to send_multipart",
                    f"could not resolve {ast.unparse(site.frames)[:60]} at line {site.call.lineno} "
                    f"({index.qualname(site.function, site.parsed)})")
            )
            continue
        roles = sender_role(index, site.function, site.parsed, found_loops)
        if not roles:
            gaps.append(
                Gap(site.parsed.relpath, "which role sends a message",
                    f"could not tell who runs {index.qualname(site.function, site.parsed)} (line {site.call.lineno})")
            )
            continue
        nested = isinstance(index.enclosing(site.function, site.parsed)[0], ast.FunctionDef) if index.enclosing(
            site.function, site.parsed) else False
        via = [] if nested else sorted({
            index.qualname(caller, parsed).split(".")[-1]
            for call, parsed in calls_to(index, site.function.name, site.function, site.parsed)
            if (caller := _enclosing_function(index, call, parsed)) is not None
        })
        for role in sorted(roles):
            for shape in shapes:
                messages.append(
                    SentMessage(
                        backend=backend,
                        sender_role=role,
                        tag=shape.tag(),
                        shape=shape,
                        file=site.parsed.relpath,
                        line=site.call.lineno,
                        function=index.qualname(site.function, site.parsed),
                        via=via,
                        conditions=_site_conditions(site),
                    )
                )
    return _dedupe(messages)


def _dedupe(messages: list[SentMessage]) -> list[SentMessage]:
    unique: dict[tuple, SentMessage] = {}
    for message in messages:
        key = (message.sender_role, message.tag, message.shape, message.file, message.line)
        unique.setdefault(key, message)
    return list(unique.values())


def has_bootstrap_timeout(index: SourceIndex, classes: BackendClasses) -> bool | None:
    """Does the backend's KVSender.poll (or what it calls on self, one level) apply a bootstrap timeout?"""
    if classes.sender is None:
        return None
    found = index.find_method(classes.sender, "poll")
    if found is None:
        return None
    pending = [found]
    visited: set[int] = set()
    for _ in range(3):
        next_round = []
        for _owner, method in pending:
            if id(method) in visited:
                continue
            visited.add(id(method))
            for node in ast.walk(method):
                text = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
                if "bootstrap_timeout" in text.lower():
                    return True
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    if isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
                        callee = index.find_method(classes.sender, node.func.attr)
                        if callee:
                            next_round.append(callee)
        pending = next_round
    return False
