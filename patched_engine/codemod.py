"""The libcst codemod that hardens a release's NIXL prefill bootstrap loop (``nixl/conn.py``).

Five steps, each decided from the code in front of it, never from a version number:

1. an ABORT branch before the GUARD check (only where the loop has no ABORT case);
2. the GUARD assert becomes a warning that drops the frame;
3. every message after ``recv_multipart()`` is handled inside its own try/except;
4. the bootstrap thread starts with ``daemon=True``;
5. an unguarded ``self.transfer_infos[room]`` read in ``add_transfer_request`` (the
   scheduler-thread transfer path up to 0.5.11) skips a cleared room.

Every place the codemod edits is an *anchor* that must be found exactly once; if one
is not, it refuses with :class:`AnchorError` naming it, and changes nothing. A
module-level sentinel (``PD_FORENSICS_PATCH``) makes a second run a no-op that says so.
libcst keeps the file's formatting and comments; only the inserted lines differ.
"""

from __future__ import annotations

import difflib
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import libcst as cst
import libcst.matchers as m

from forensics.exitcodes import ExitStatus, ForensicsError
from patched_engine import snippets

DEFAULT_LABEL = "sglang/srt/disaggregation/nixl/conn.py"

StepStatus = Literal["applied", "skipped", "already"]

STEP_NAMES = {
    1: "abort-branch",
    2: "guard-warning",
    3: "per-message-try",
    4: "daemon-thread",
    5: "cleared-room-skip",
}

# What each anchor is, in words, for the refusal message.
ANCHORS = {
    "guard-constant": "module-level `GUARD = ...` assignment",
    "manager-class": "`class NixlKVManager`",
    "bootstrap-method": "`def _start_bootstrap_thread` in NixlKVManager",
    "bootstrap-function": "nested `def bootstrap_thread()` in _start_bootstrap_thread",
    "bootstrap-loop": "`while True:` in bootstrap_thread",
    "recv-statement": "`<frames> = self.server_socket.recv_multipart()` at the top of the loop",
    "guard-assert": "`assert <frames>[0] == GUARD` in the loop body",
    "thread-start": "`threading.Thread(target=bootstrap_thread...)` in _start_bootstrap_thread",
    "add-transfer-request": "`def add_transfer_request` in NixlKVManager",
    "sentinel": f"module-level `{snippets.SENTINEL_NAME} = ...`",
}


class PatchError(ForensicsError, ValueError):
    """The file cannot be patched; the message says why. A finding about the file (exit 1, as
    ``forensics patch`` reports a refusal), and a ValueError for callers that test the input."""

    exit_status = ExitStatus.BAD
    word = "fail"


class AnchorError(PatchError):
    """An anchor the codemod needs was found zero or several times."""

    def __init__(self, anchor: str, found: int, label: str) -> None:
        self.anchor = anchor
        self.found = found
        self.label = label
        super().__init__(
            f"{label}: refusing to patch: anchor {anchor!r} ({ANCHORS[anchor]}) "
            f"found {found} times, expected exactly once"
        )


@dataclass(frozen=True)
class StepOutcome:
    step: int
    name: str
    status: StepStatus
    reason: str

    def to_dict(self) -> dict:
        return {"step": self.step, "name": self.name, "status": self.status, "reason": self.reason}


@dataclass
class PatchResult:
    """The outcome of one codemod run: the new text, what each step did, and the diff."""

    original: str
    new_text: str
    steps: list[StepOutcome]
    release: str | None = None
    label: str = DEFAULT_LABEL
    diff: str = field(init=False)

    def __post_init__(self) -> None:
        self.diff = unified_diff(self.original, self.new_text, self.label)

    @property
    def changed(self) -> bool:
        return self.new_text != self.original

    @property
    def already_patched(self) -> bool:
        return not self.changed and all(s.status == "already" for s in self.steps)

    def step(self, number: int) -> StepOutcome:
        return next(s for s in self.steps if s.step == number)

    def to_dict(self) -> dict:
        return {
            "release": self.release,
            "file": self.label,
            "patch_id": snippets.PATCH_ID,
            "changed": self.changed,
            "already_patched": self.already_patched,
            "steps": [s.to_dict() for s in self.steps],
            "diff": self.diff,
        }

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([s.to_dict() for s in self.steps], columns=["step", "name", "status", "reason"])

    def headline(self) -> str:
        where = f"sglang {self.release} " if self.release else ""
        if self.already_patched:
            return f"{where}{self.label}: already patched ({snippets.PATCH_ID}); nothing to change"
        applied = sum(s.status == "applied" for s in self.steps)
        return f"{where}{self.label}: {applied} of {len(self.steps)} steps applied"

    def __rich__(self):
        from rich.table import Table

        table = Table(title=self.headline(), show_lines=False)
        for column in ("step", "name", "status", "reason"):
            table.add_column(column, overflow="fold")
        styles = {"applied": "green", "already": "cyan", "skipped": "yellow"}
        for s in self.steps:
            table.add_row(str(s.step), s.name, f"[{styles[s.status]}]{s.status}[/]", s.reason)
        return table

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{s.step}</td><td>{s.name}</td><td>{s.status}</td><td>{html.escape(s.reason)}</td></tr>"
            for s in self.steps
        )
        return (
            f"<p><b>{html.escape(self.headline())}</b></p>"
            "<table><tr><th>step</th><th>name</th><th>status</th><th>reason</th></tr>"
            f"{rows}</table>"
            f"<details><summary>unified diff ({self.diff.count(chr(10))} lines)</summary>"
            f"<pre>{html.escape(self.diff)}</pre></details>"
        )


def unified_diff(before: str, after: str, label: str = DEFAULT_LABEL) -> str:
    """A ``git apply``/``patch -p1`` compatible diff, with the no-final-newline marker."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{label}", f"b/{label}"
    )
    out = []
    for line in lines:
        if line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)


# ----------------------------------------------------------------------------- matching


def _exactly_one(found: Sequence, anchor: str, label: str):
    if len(found) != 1:
        raise AnchorError(anchor, len(found), label)
    return found[0]


def _indices(body: Sequence[cst.CSTNode], matcher) -> list[int]:
    return [i for i, node in enumerate(body) if m.matches(node, matcher)]


def _assign_to(name: str):
    return m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name(name))])])


def _function(name: str):
    return m.FunctionDef(name=m.Name(name))


_RECV = m.SimpleStatementLine(
    body=[
        m.Assign(
            targets=[m.AssignTarget(target=m.Name())],
            value=m.Call(func=m.Attribute(value=m.Attribute(attr=m.Name("server_socket")), attr=m.Name("recv_multipart"))),
        )
    ]
)


def _guard_assert(frames: str):
    return m.SimpleStatementLine(
        body=[
            m.Assert(
                test=m.Comparison(
                    left=m.Subscript(value=m.Name(frames), slice=[m.SubscriptElement(slice=m.Index(value=m.Integer("0")))]),
                    comparisons=[m.ComparisonTarget(operator=m.Equal(), comparator=m.Name("GUARD"))],
                )
            )
        ]
    )


def _our_guard_check(frames: str):
    return m.If(
        test=m.Comparison(
            left=m.Subscript(value=m.Name(frames)),
            comparisons=[m.ComparisonTarget(operator=m.NotEqual(), comparator=m.Name("GUARD"))],
        )
    )


_THREAD_CALL = m.Call(
    func=m.Attribute(value=m.Name("threading"), attr=m.Name("Thread")) | m.Name("Thread"),
    args=[m.ZeroOrMore(), m.Arg(keyword=m.Name("target"), value=m.Name(m.MatchRegex(r"bootstrap_thread\w*"))), m.ZeroOrMore()],
)

# What a loop that already handles ABORT looks like: sglang 0.5.16+ calls
# ``self._handle_abort_notification(...)``; a compare against b"ABORT"/ABORT_TAG counts too.
_ABORT_CASE = (
    m.Call(func=m.Attribute(attr=m.Name("_handle_abort_notification")))
    | m.Comparison(comparisons=[m.ZeroOrMore(), m.ComparisonTarget(comparator=m.SimpleString(m.MatchRegex(r"[bB]['\"]ABORT['\"]"))), m.ZeroOrMore()])
    | m.Comparison(comparisons=[m.ZeroOrMore(), m.ComparisonTarget(comparator=m.Name("ABORT_TAG")), m.ZeroOrMore()])
)


def _contains(node: cst.CSTNode, matcher) -> bool:
    return bool(m.findall(node, matcher))


def _comment_lines(text: str) -> list[cst.EmptyLine]:
    return [cst.EmptyLine(comment=cst.Comment(line)) for line in text.splitlines()]


# ----------------------------------------------------------------------------- the codemod


class _Patcher:
    """One run over one file; collects step outcomes while rebuilding the tree."""

    def __init__(self, text: str, label: str) -> None:
        self.label = label
        try:
            self.module = cst.parse_module(text)
        except cst.ParserSyntaxError as exc:
            raise PatchError(f"{label}: not valid Python, cannot patch: {exc}") from exc
        self.config = self.module.config_for_parsing
        self.steps: dict[int, StepOutcome] = {}

    # -- helpers -------------------------------------------------------------------------

    def outcome(self, step: int, status: StepStatus, reason: str) -> None:
        self.steps[step] = StepOutcome(step, STEP_NAMES[step], status, reason)

    def statements(self, template: str, **values) -> list[cst.BaseStatement]:
        """Parse a template into statements; a leading ``# ...`` comment stays attached.

        A throw-away first statement keeps that comment off the module header.
        """
        code = "pass\n" + template.format(mark=snippets.MARK, **values).strip("\n") + "\n"
        return list(cst.parse_module(code).body)[1:]

    def statement(self, template: str, **values) -> cst.BaseStatement:
        parsed = self.statements(template, **values)
        assert len(parsed) == 1, template
        return parsed[0]

    # -- the run -------------------------------------------------------------------------

    def run(self) -> str:
        module = self.module
        label = self.label
        sentinels = _indices(module.body, _assign_to(snippets.SENTINEL_NAME))
        if sentinels:
            return self.already_patched(sentinels)

        guard_at = _exactly_one(_indices(module.body, _assign_to("GUARD")), "guard-constant", label)
        class_at = _exactly_one(
            _indices(module.body, m.ClassDef(name=m.Name("NixlKVManager"))), "manager-class", label
        )
        manager: cst.ClassDef = module.body[class_at]
        manager = self.patch_manager(manager)

        prelude = self.statements(snippets.MODULE_PRELUDE)
        prelude[0] = prelude[0].with_changes(leading_lines=[cst.EmptyLine(), *prelude[0].leading_lines])
        prelude[1] = prelude[1].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        body = list(module.body)
        body[class_at] = manager
        after = guard_at + 1
        if after < len(body):
            # Keep PEP 8's two blank lines between our helper and whatever followed GUARD.
            following = body[after]
            blanks = [line for line in following.leading_lines if line.comment is None]
            if len(blanks) < 2:
                extra = [cst.EmptyLine()] * (2 - len(blanks))
                body[after] = following.with_changes(leading_lines=[*extra, *following.leading_lines])
        body[after:after] = prelude
        new_module = module.with_changes(body=body)
        return new_module.code

    def already_patched(self, sentinels: list[int]) -> str:
        node = self.module.body[_exactly_one(sentinels, "sentinel", self.label)]
        value = node.body[0].value
        found = value.evaluated_value if isinstance(value, cst.SimpleString) else None
        if found != snippets.PATCH_ID:
            raise PatchError(
                f"{self.label}: already carries {snippets.SENTINEL_NAME} = {found!r}, a different patch "
                f"than {snippets.PATCH_ID!r}; restore the original file before patching"
            )
        reason = f"file already carries {snippets.SENTINEL_NAME} = {found!r}"
        for number in STEP_NAMES:
            self.outcome(number, "already", reason)
        return self.module.code

    def patch_manager(self, manager: cst.ClassDef) -> cst.ClassDef:
        label = self.label
        members = list(manager.body.body)
        method_at = _exactly_one(_indices(members, _function("_start_bootstrap_thread")), "bootstrap-method", label)
        method: cst.FunctionDef = members[method_at]
        method, needs_abort_handler = self.patch_bootstrap_method(method)
        members[method_at] = method

        transfer_at = _indices(members, _function("add_transfer_request"))
        if len(transfer_at) > 1:
            raise AnchorError("add-transfer-request", len(transfer_at), label)
        if transfer_at:
            members[transfer_at[0]] = self.patch_add_transfer_request(members[transfer_at[0]])
        else:
            self.outcome(5, "skipped", "NixlKVManager has no add_transfer_request")

        if needs_abort_handler:
            handler = self.statement(
                snippets.ABORT_HANDLER,
                name=snippets.ABORT_HANDLER_NAME,
                patch_id=snippets.PATCH_ID,
                record_failure=snippets.RECORD_FAILURE if self.has_record_failure() else "",
                mark_failed=(
                    snippets.MARK_FAILED_VIA_UPDATE_STATUS
                    if self.failed_overrides(manager)
                    else snippets.MARK_FAILED_DIRECTLY
                ),
            )
            handler = handler.body.body[0]  # the template wraps it in a class for its indentation
            handler = handler.with_changes(leading_lines=[cst.EmptyLine(indent=False), *handler.leading_lines])
            members.insert(method_at, handler)
        return manager.with_changes(body=manager.body.with_changes(body=members))

    def has_record_failure(self) -> bool:
        """record_failure exists from 0.5.3: defined here (0.5.3-0.5.9) or called on self (0.5.10+)."""
        return _contains(self.module, m.FunctionDef(name=m.Name("record_failure"))) or _contains(
            self.module, m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("record_failure")))
        )

    def failed_overrides(self, manager: cst.ClassDef) -> bool:
        """Whether this release's update_status lets Failed replace a higher status.

        NixlKVManager's own update_status (up to 0.5.9, and 0.5.16-0.5.19) special-cases
        ``status == KVPoll.Failed`` from 0.5.6; before that it keeps the max. Where NIXL
        inherits it (0.5.10-0.5.15, 0.5.20+), CommonKVManager's version special-cases Failed.
        """
        own = [n for n in manager.body.body if m.matches(n, _function("update_status"))]
        if not own:
            return True
        return _contains(
            own[0],
            m.Comparison(
                comparisons=[
                    m.ComparisonTarget(
                        operator=m.Equal() | m.Is(), comparator=m.Attribute(value=m.Name("KVPoll"), attr=m.Name("Failed"))
                    )
                ]
            ),
        )

    def patch_bootstrap_method(self, method: cst.FunctionDef) -> tuple[cst.FunctionDef, bool]:
        label = self.label
        statements = list(method.body.body)
        inner_at = _exactly_one(_indices(statements, _function("bootstrap_thread")), "bootstrap-function", label)
        inner: cst.FunctionDef = statements[inner_at]
        inner, needs_abort_handler = self.patch_loop_function(inner)
        statements[inner_at] = inner
        method = method.with_changes(body=method.body.with_changes(body=statements))

        # Step 4: the thread start may be nested in an expression statement; replace it in place.
        calls = m.findall(method, _THREAD_CALL)
        call: cst.Call = _exactly_one(calls, "thread-start", label)
        daemon = [a for a in call.args if a.keyword is not None and a.keyword.value == "daemon"]
        if daemon and m.matches(daemon[0].value, m.Name("True")):
            self.outcome(4, "already", "the bootstrap thread already starts with daemon=True")
        else:
            kept = [a for a in call.args if a not in daemon]
            last = kept[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            new_call = call.with_changes(
                args=[*kept[:-1], last, cst.Arg(keyword=cst.Name("daemon"), value=cst.Name("True"),
                                                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))]
            )
            method = method.deep_replace(call, new_call)
            self.outcome(
                4, "applied",
                "the bootstrap thread starts with daemon=True, so it can no longer hold the process at exit",
            )
        return method, needs_abort_handler

    def patch_loop_function(self, inner: cst.FunctionDef) -> tuple[cst.FunctionDef, bool]:
        label = self.label
        statements = list(inner.body.body)
        loop_at = _exactly_one(
            _indices(statements, m.While(test=m.Name("True"))), "bootstrap-loop", label
        )
        loop: cst.While = statements[loop_at]
        body = list(loop.body.body)
        recv_at = _exactly_one(_indices(body, _RECV), "recv-statement", label)
        frames = body[recv_at].body[0].targets[0].target.value

        # Step 2: the GUARD assert (refuse when it is not there exactly once).
        assert_at = _exactly_one(_indices(body, _guard_assert(frames)), "guard-assert", label)
        # The first inserted statement inherits the assert's leading blank lines and comments.
        old_assert = body[assert_at]
        guard_check = self.statement(snippets.GUARD_CHECK, frames=frames)
        body[assert_at] = guard_check
        self.outcome(2, "applied", "assert on GUARD replaced by a warning that drops the frame and continues")

        # Step 1: an ABORT case before the GUARD check, unless the loop already has one.
        needs_abort_handler = not any(_contains(stmt, _ABORT_CASE) for stmt in body[:assert_at])
        if needs_abort_handler:
            branch = self.statement(snippets.ABORT_BRANCH, frames=frames, handler=snippets.ABORT_HANDLER_NAME)
            body.insert(assert_at, branch)
        first = body[assert_at]
        body[assert_at] = first.with_changes(leading_lines=[*old_assert.leading_lines, *first.leading_lines])
        if needs_abort_handler:
            self.outcome(
                1, "applied",
                f"ABORT branch added before the GUARD check; {snippets.ABORT_HANDLER_NAME} fails a known, "
                "unfinished room and logs each ABORT at INFO",
            )
        else:
            self.outcome(1, "skipped", "the loop already handles ABORT before the GUARD check")

        # Step 3: everything after recv_multipart() goes inside one try/except per message.
        # recv itself stays outside: a closed socket or terminated context must still end the thread.
        rest = body[recv_at + 1:]
        if not rest:
            raise AnchorError("recv-statement", 0, label)
        wrapper: cst.Try = self.statement(
            snippets.PER_MESSAGE_TRY, frames=frames, helper=snippets.FRAME_ROOM_HELPER_NAME
        )
        wrapper = wrapper.with_changes(body=wrapper.body.with_changes(body=rest))
        body = [*body[: recv_at + 1], wrapper]
        self.outcome(3, "applied", "every message after recv_multipart() is handled inside its own try/except")

        loop = loop.with_changes(body=loop.body.with_changes(body=body))
        statements[loop_at] = loop
        return inner.with_changes(body=inner.body.with_changes(body=statements)), needs_abort_handler

    def patch_add_transfer_request(self, function: cst.FunctionDef) -> cst.FunctionDef:
        params = function.params.params
        if len(params) < 2:
            self.outcome(5, "skipped", "add_transfer_request takes no room argument")
            return function
        room = params[1].name.value
        lookup = m.Subscript(
            value=m.Attribute(value=m.Name("self"), attr=m.Name("transfer_infos")),
            slice=[m.SubscriptElement(slice=m.Index(value=m.Name(room)))],
        )
        guard = m.If(
            test=m.Comparison(
                left=m.Name(room),
                comparisons=[m.ComparisonTarget(operator=m.NotIn(), comparator=m.Attribute(attr=m.Name("transfer_infos")))],
            )
        )
        statements = list(function.body.body)
        for index, statement in enumerate(statements):
            if m.matches(statement, guard):
                self.outcome(5, "skipped", f"add_transfer_request already returns early when {room} is not in transfer_infos")
                return function
            if isinstance(statement, cst.Try):
                continue
            if _contains(statement, lookup):
                returns_value = any(
                    r.value is not None and not m.matches(r.value, m.Name("None"))
                    for r in m.findall(function, m.Return())
                )
                skip = self.statement(snippets.CLEARED_ROOM_GUARD, room=room, empty="[]" if returns_value else "None")
                statements.insert(index, skip.with_changes(leading_lines=[*statement.leading_lines, *skip.leading_lines]))
                statements[index + 1] = statement.with_changes(leading_lines=[])
                self.outcome(
                    5, "applied",
                    f"add_transfer_request (scheduler thread) now skips a room missing from transfer_infos "
                    f"instead of raising KeyError at `self.transfer_infos[{room}]`",
                )
                return function.with_changes(body=function.body.with_changes(body=statements))
        self.outcome(
            5, "skipped",
            "add_transfer_request has no unguarded transfer_infos lookup; the transfer workers' lookups sit "
            "inside their try/except (sglang 0.5.12+)",
        )
        return function


def patch_source(text: str, release: str | None = None, *, label: str = DEFAULT_LABEL) -> PatchResult:
    """Patch the text of a release's ``nixl/conn.py``; see the module docstring for the steps.

    Raises :class:`AnchorError` (naming the anchor) when an edit point is not found exactly
    once, :class:`PatchError` when the file is not Python or carries another patch.
    """
    patcher = _Patcher(text, label)
    new_text = patcher.run()
    if new_text != text:
        try:
            compile(new_text, label, "exec")
        except SyntaxError as exc:  # a codemod bug, never the user's
            raise PatchError(f"{label}: the patched file does not compile ({exc}); nothing written") from exc
    steps = [patcher.steps[n] for n in sorted(patcher.steps)]
    return PatchResult(original=text, new_text=new_text, steps=steps, release=release, label=label)
