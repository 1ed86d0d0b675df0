"""Find the receiver loops of one release and evaluate them per backend.

Receiver loops are found from ``threading.Thread(target=...)`` calls whose target (or
the function a wrapper target calls) loops over a ZMQ receive; nothing is looked up by
method name, so a fork that renames ``_start_bootstrap_thread`` is still mapped. A
loop's role comes from where its starter is called (``if ... DisaggregationMode.PREFILL``),
falling back on its name.

Each loop is then evaluated per backend (its branches, what each frame shape does to it);
the senders, whose frames are run through it, are :mod:`forensics.handlers.senders`'.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from forensics.handlers.branches import extract_branches
from forensics.handlers.dispatch import Opaque
from forensics.handlers.loops import LoopCode, foreign_shape, run_frame, structural_problems
from forensics.handlers.model import (
    DECODE,
    NOT_INTERPRETED,
    PREFILL,
    ROLE_UNKNOWN,
    Gap,
    ReceiverLoop,
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


def local_defs(scope: ast.AST) -> dict[str, ast.FunctionDef]:
    return {
        n.name: n
        for n in ast.walk(scope)
        if isinstance(n, ast.FunctionDef) and n is not scope
    }


def thread_calls(parsed: ParsedFile) -> list[ast.Call]:
    calls = []
    for node in ast.walk(parsed.tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Thread":
            if any(k.arg == "target" for k in node.keywords):
                calls.append(node)
    return calls


def daemon_flag(call: ast.Call, scope: ast.AST | None) -> bool | None:
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
        for call in thread_calls(parsed):
            target = next(k.value for k in call.keywords if k.arg == "target")
            chain = index.enclosing(call, parsed)
            starter = next((n for n in chain if isinstance(n, ast.FunctionDef)), None)
            owner = index.enclosing_class(call, parsed)
            function: ast.FunctionDef | None = None
            if isinstance(target, ast.Name) and starter is not None:
                function = local_defs(starter).get(target.id)
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
                siblings = local_defs(starter)
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
                daemon=daemon_flag(call, starter),
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


def mode_of_call(index: SourceIndex, call: ast.AST, parsed: ParsedFile) -> str | None:
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
        for call, parsed in calls_to(index, loop.starter.name):
            mode = mode_of_call(index, call, parsed)
            if mode:
                return mode
    names = [loop.code.function.name, loop.target_name]
    if loop.starter is not None:
        names.insert(0, loop.starter.name)
    return _name_role(*names)


def calls_to(
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
