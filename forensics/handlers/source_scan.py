"""Find the receiver loops and the senders of one release, per backend.

Receiver loops are found from ``threading.Thread(target=...)`` calls whose target (or
the function a wrapper target calls) loops over a ZMQ receive; nothing is looked up by
method name, so a fork that renames ``_start_bootstrap_thread`` is still mapped. A
loop's role comes from where its starter is called (``if ... DisaggregationMode.PREFILL``),
falling back on its name.

Senders are the ``send_multipart`` calls, followed back through wrappers that take the
frames as a parameter (``_send_multipart_locked``, ``_send_bootstrap_message``) and
forward into builders (``AbortNotification(...).to_zmq()``,
``self.kv_mgr.build_receiver_registration_message()``, resolved in each backend's own
class so overrides win). Which role sends comes from the class (``*KVReceiver`` is the
decode side), the loop it sits in, or its callers.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from forensics.handlers.dispatch import (
    Const,
    Interpreter,
    LoopCode,
    Opaque,
    State,
    extract_branches,
    foreign_shape,
    run_frame,
    structural_problems,
)
from forensics.handlers.model import (
    DECODE,
    NOT_INTERPRETED,
    PREFILL,
    ROLE_UNKNOWN,
    Element,
    FrameShape,
    Gap,
    ReceiverLoop,
    SentMessage,
    Unreadable,
)
from forensics.handlers.source_index import ClassInfo, ParsedFile, SourceIndex

CALLER_DEPTH = 4


# ----------------------------------------------------------------------------- loops


@dataclass
class FoundLoop:
    """A receiver loop as found in the source, before it is evaluated for a backend."""

    code: LoopCode
    defined_in: str  # backend directory of the file ("nixl", "common")
    owner_class: str | None
    starter: ast.FunctionDef | None  # the method that creates the thread
    thread_call: ast.Call
    target_name: str
    wrapper: str
    daemon: bool | None
    role: str | None


def _receive_name(loop: ast.While) -> str | None:
    """The name the loop binds each received message to."""
    for node in ast.walk(loop):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr == "recv_multipart":
                return node.targets[0].id
            if isinstance(func, ast.Name) and "recv" in func.id:
                return node.targets[0].id
    return None


def _find_while(function: ast.FunctionDef) -> tuple[ast.While, str] | None:
    for node in ast.walk(function):
        if isinstance(node, ast.While):
            name = _receive_name(node)
            if name is not None:
                return node, name
    return None


def _local_defs(scope: ast.AST) -> dict[str, ast.FunctionDef]:
    return {
        n.name: n
        for n in ast.walk(scope)
        if isinstance(n, ast.FunctionDef) and n is not scope
    }


def _thread_calls(parsed: ParsedFile) -> list[ast.Call]:
    calls = []
    for node in ast.walk(parsed.tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Thread":
            if any(k.arg == "target" for k in node.keywords):
                calls.append(node)
    return calls


def _daemon(call: ast.Call, scope: ast.AST | None) -> bool | None:
    for keyword in call.keywords:
        if keyword.arg == "daemon":
            if isinstance(keyword.value, ast.Constant):
                return bool(keyword.value.value)
            return None
    if scope is not None:
        for node in ast.walk(scope):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == "daemon"
                and isinstance(node.value, ast.Constant)
            ):
                return bool(node.value.value)
    return False


def _wrapper_kind(wrapper: ast.FunctionDef, inner_name: str) -> str:
    for node in ast.walk(wrapper):
        if isinstance(node, ast.Try) and any(
            isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == inner_name
            for s in node.body
            for c in ast.walk(s)
        ):
            reraises = all(any(isinstance(n, ast.Raise) for s in h.body for n in ast.walk(s)) for h in node.handlers)
            return "logs and re-raises" if reraises else "swallows"
    return "calls through (no try)"


def find_loops(index: SourceIndex, gaps: list[Gap]) -> list[FoundLoop]:
    loops: list[FoundLoop] = []
    for parsed in index.files.values():
        for call in _thread_calls(parsed):
            target = next(k.value for k in call.keywords if k.arg == "target")
            chain = index.enclosing(call, parsed)
            starter = next((n for n in chain if isinstance(n, ast.FunctionDef)), None)
            owner = index.enclosing_class(call, parsed)
            function: ast.FunctionDef | None = None
            if isinstance(target, ast.Name) and starter is not None:
                function = _local_defs(starter).get(target.id)
            elif isinstance(target, ast.Attribute) and owner is not None:
                found = index.find_method(owner.name, target.attr)
                function = found[1] if found else None
            if function is None:
                continue
            wrapper = "none"
            located = _find_while(function)
            loop_function = function
            if located is None and starter is not None:
                # A wrapper target (bootstrap_thread_guarded) calling the real loop.
                siblings = _local_defs(starter)
                for node in ast.walk(function):
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in siblings:
                        inner = siblings[node.func.id]
                        if inner is not function and _find_while(inner) is not None:
                            loop_function = inner
                            located = _find_while(inner)
                            wrapper = _wrapper_kind(function, inner.name)
                            break
            if located is None:
                continue
            while_node, message_name = located
            recv_helper, recv_class = _recv_helper(index, starter, owner, while_node)
            code = LoopCode(
                function=loop_function,
                loop=while_node,
                message_name=message_name,
                parsed=parsed,
                self_class=owner.name if owner else None,
                recv_helper=recv_helper,
                recv_helper_class=recv_class,
            )
            found_loop = FoundLoop(
                code=code,
                defined_in=parsed.relpath.split("/")[0],
                owner_class=owner.name if owner else None,
                starter=starter,
                thread_call=call,
                target_name=ast.unparse(target),
                wrapper=wrapper,
                daemon=_daemon(call, starter),
                role=None,
            )
            found_loop.role = _loop_role(index, found_loop)
            if found_loop.role is None:
                gaps.append(
                    Gap(parsed.relpath, "the role (prefill/decode) of a receiver loop",
                        f"could not tell which role runs {loop_function.name} (line {loop_function.lineno})")
                )
            loops.append(found_loop)
    return loops


def _recv_helper(
    index: SourceIndex, starter: ast.FunctionDef | None, owner: ClassInfo | None, loop: ast.While
) -> tuple[ast.FunctionDef | None, str | None]:
    """``recv = self._make_worker_recv(socket)`` in the starter: the wrapper may consume frames."""
    if starter is None or owner is None:
        return None, None
    for node in ast.walk(starter):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and "recv" in node.targets[0].id
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
        ):
            found = index.find_method(owner.name, node.value.func.attr)
            if found:
                return found[1], owner.name
    return None, None


def _mode_of_call(index: SourceIndex, call: ast.AST, parsed: ParsedFile) -> str | None:
    """PREFILL/DECODE from the nearest ``if ... DisaggregationMode.X`` around a call."""
    child = call
    current = parsed.parents.get(call)
    while current is not None and not isinstance(current, ast.FunctionDef | ast.ClassDef | ast.Module):
        if isinstance(current, ast.If):
            test = ast.unparse(current.test)
            modes = [m for m in ("PREFILL", "DECODE") if f"DisaggregationMode.{m}" in test]
            if len(modes) == 1:
                in_body = child in current.body
                mode = modes[0] if in_body else ("DECODE" if modes[0] == "PREFILL" else "PREFILL")
                if "!=" in test or " not " in f" {test} ":
                    mode = "DECODE" if mode == "PREFILL" else "PREFILL"
                return PREFILL if mode == "PREFILL" else DECODE
        child = current
        current = parsed.parents.get(current)
    return None


def _name_role(*names: str) -> str | None:
    for name in names:
        lowered = name.lower()
        if "decode" in lowered:
            return DECODE
        if "prefill" in lowered or "bootstrap" in lowered:
            return PREFILL
    return None


def _loop_role(index: SourceIndex, loop: FoundLoop) -> str | None:
    if loop.starter is not None:
        for call, parsed in _calls_to(index, loop.starter.name):
            mode = _mode_of_call(index, call, parsed)
            if mode:
                return mode
    names = [loop.code.function.name, loop.target_name]
    if loop.starter is not None:
        names.insert(0, loop.starter.name)
    return _name_role(*names)


def _calls_to(
    index: SourceIndex, name: str, function: ast.FunctionDef | None = None, defined_in: ParsedFile | None = None
) -> list[tuple[ast.AST, ParsedFile]]:
    """Every call of (or ``target=`` reference to) a function or method by its name.

    Given the function itself, a ``self.name(...)`` call counts only when ``self``'s class
    and the function's class are related (one inherits the other): ``clear`` on a sender
    is not ``clear`` on a receiver.
    """
    owner = index.enclosing_class(function, defined_in) if function is not None and defined_in else None
    related: set[str] | None = None
    if owner is not None:
        related = {info.name for info in index.mro(owner.name, owner.file)}
    found = []
    for node, parsed in index.calls_by_name.get(name, []):
        func = node.func
        hit = True
        if related is not None and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
                and func.value.id == "self":
            caller_class = index.enclosing_class(node, parsed)
            if caller_class is not None:
                caller_chain = {info.name for info in index.mro(caller_class.name, caller_class.file)}
                hit = bool(related & caller_chain) and (owner.name in caller_chain or caller_class.name in related)
        if hit:
            found.append((node, parsed))
    found.extend(index.target_refs.get(name, []))
    return found


# ----------------------------------------------------------------------------- backends


@dataclass
class BackendClasses:
    backend: str
    manager: str | None
    sender: str | None
    receiver: str | None
    parent_backend: str | None

    def concrete_for(self, index: SourceIndex, class_name: str | None) -> str | None:
        """The backend's own class whose inheritance includes ``class_name``."""
        if class_name is None:
            return None
        for own in (self.manager, self.receiver, self.sender):
            if own and any(info.name == class_name for info in index.mro(own)):
                return own
        return None


def backend_classes(index: SourceIndex, backend: str) -> BackendClasses:
    relpath = f"{backend}/conn.py"
    own = index.classes_in(relpath)

    def pick(suffix: str) -> str | None:
        matches = [c.name for c in own if c.name.endswith(suffix)]
        return matches[0] if matches else None

    manager = pick("KVManager") or pick("Manager")
    parent = None
    if manager:
        for info in index.mro(manager)[1:]:
            directory = info.file.relpath.split("/")[0]
            if directory not in ("common", "base", backend):
                parent = directory
                break
    return BackendClasses(backend, manager, pick("KVSender"), pick("KVReceiver"), parent)


def loops_for_backend(
    index: SourceIndex, backend: str, classes: BackendClasses, found: list[FoundLoop]
) -> list[tuple[FoundLoop, str | None]]:
    """The loops a backend's manager runs, own or inherited (not overridden), with where they come from."""
    chosen: list[tuple[FoundLoop, str | None]] = []
    if classes.manager is None:
        return chosen
    for loop in found:
        if loop.owner_class is None or loop.starter is None:
            continue
        resolved = index.find_method(classes.manager, loop.starter.name)
        if resolved is None or resolved[0].name != loop.owner_class:
            continue
        inherited = None if loop.defined_in == backend else loop.defined_in
        chosen.append((loop, inherited))
    return chosen


def not_understood(index: SourceIndex, opaque: list[Opaque], backend: str) -> list[Unreadable]:
    """What the interpreter could not interpret, as the backend's :class:`Unreadable` entries."""
    return [
        Unreadable(o.file, o.line, backend, o.reason, NOT_INTERPRETED, str(index.root / o.file)) for o in opaque
    ]


def evaluate_loop(index: SourceIndex, loop: FoundLoop, backend: str, classes: BackendClasses,
                  inherited: str | None) -> tuple[ReceiverLoop, LoopCode]:
    """The loop as this backend runs it: ``self`` is the backend's own manager class.

    ``not_understood`` on the result lists what the interpreter met in the loop (as written,
    and on the way of the two foreign probes) and could not interpret, and a role it could not
    tell; the caller adds what the delivered messages met.
    """
    code = LoopCode(
        function=loop.code.function,
        loop=loop.code.loop,
        message_name=loop.code.message_name,
        parsed=loop.code.parsed,
        self_class=classes.manager or loop.owner_class,
        recv_helper=loop.code.recv_helper,
        recv_helper_class=classes.manager or loop.code.recv_helper_class,
    )
    function = code.function
    per_message_try = any(
        isinstance(s, ast.Try)
        and any(h.type is None or "Exception" in ast.unparse(h.type) for h in s.handlers)
        and not all(any(isinstance(n, ast.Raise) for b in h.body for n in ast.walk(b)) for h in s.handlers)
        for s in code.loop.body
    )
    parsed = code.parsed
    opaque = structural_problems(code)
    receiver = ReceiverLoop(
        backend=inherited or backend,
        role=loop.role or "unknown",
        function=index.qualname(function, parsed),
        file=parsed.relpath,
        line=function.lineno,
        end_line=function.end_lineno or function.lineno,
        branches=extract_branches(index, code),
        foreign=run_frame(index, code, foreign_shape(4), opaque),
        foreign_short=run_frame(index, code, foreign_shape(1), opaque),
        per_message_try=per_message_try,
        wrapper=loop.wrapper,
        daemon=loop.daemon,
        started_at=f"{parsed.relpath}:{loop.thread_call.lineno}",
        target=loop.target_name,
        source=parsed.segment(function.lineno, function.end_lineno or function.lineno),
        inherited_from=inherited,
        recv_helper=code.recv_helper.name if code.recv_helper is not None else None,
    )
    if loop.role is None:
        receiver.not_understood.append(
            Unreadable(parsed.relpath, function.lineno, backend,
                       f"could not tell which role (prefill or decode) runs {function.name}: no "
                       "DisaggregationMode test around its starter and no role in its name", ROLE_UNKNOWN,
                       str(index.root / parsed.relpath))
        )
    receiver.not_understood.extend(not_understood(index, opaque, backend))
    return receiver, code


# ----------------------------------------------------------------------------- senders


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
                for call, parsed in _calls_to(index, site.function.name, site.function, site.parsed):
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
            for call, caller_file in _calls_to(index, current.name, current, current_file):
                mode = _mode_of_call(index, call, caller_file)
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
    callers = _calls_to(index, function.name, function, parsed)
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
            for call, parsed in _calls_to(index, site.function.name, site.function, site.parsed)
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
