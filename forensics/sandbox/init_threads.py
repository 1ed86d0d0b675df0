"""Run the statements of a release's ``KVManager.__init__`` that start its threads, and only those.

The sandbox builds managers without ``__init__`` (it needs GPUs, torch.distributed and a
bootstrap server), yet the threads an engine runs are started there: the prefill's
``transfer_worker`` pool, the decode's heartbeat and listener. :func:`init_statements` takes
the wanted statements of one ``disaggregation_mode`` branch of the release's own ``__init__``,
compiles them with the release file's name and line numbers and returns them as a function of
the manager, run with the release module's globals: the threads are started by the release's
code, with the release's targets, exactly as py-spy then shows them.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable

from forensics.sandbox.errors import SandboxError


def _mode_branch(function: ast.FunctionDef, mode: str) -> list[ast.stmt] | None:
    for node in ast.walk(function):
        if isinstance(node, ast.If) and f"DisaggregationMode.{mode}" in ast.unparse(node.test):
            return node.body
    return None


def init_statements(cls: type, mode: str, select: Callable[[list[str]], tuple[int, int] | list[int] | None]):
    """``f(manager)`` running statements of the ``mode`` ("PREFILL" or "DECODE") branch of
    ``cls.__init__``; ``select(texts)`` gets each statement's source and returns the indices to
    run (or None: nothing to run, and then this returns None)."""
    init = cls.__init__
    try:
        source = textwrap.dedent(inspect.getsource(init))
        filename = inspect.getsourcefile(init)
    except (OSError, TypeError) as exc:
        raise SandboxError(f"cannot read {cls.__name__}.__init__'s source: {exc}") from exc
    tree = ast.parse(source)
    ast.increment_lineno(tree, init.__code__.co_firstlineno - 1)
    body = _mode_branch(tree.body[0], mode)
    if body is None:
        raise SandboxError(f"{cls.__name__}.__init__ ({filename}) has no DisaggregationMode.{mode} branch")
    chosen = select([ast.unparse(stmt) for stmt in body])
    if not chosen:
        return None
    statements = [body[i] for i in chosen]
    wrapper = ast.parse("def _release_init_threads(self):\n    pass").body[0]
    ast.increment_lineno(wrapper, statements[0].lineno - 1)
    wrapper.body = statements
    wrapper.end_lineno = statements[-1].end_lineno
    module = ast.Module(body=[wrapper], type_ignores=[])
    ast.fix_missing_locations(module)
    namespace: dict = {}
    exec(compile(module, filename, "exec"), vars(inspect.getmodule(init)), namespace)  # noqa: S102
    return namespace["_release_init_threads"]


def transfer_worker_start(cls: type):
    """The prefill branch from the queue size to the loop starting ``transfer_worker`` threads
    (0.5.12+), or None for a release that starts none (it transfers in the scheduler thread)."""
    if not callable(getattr(cls, "transfer_worker", None)):
        return None

    def select(texts: list[str]) -> list[int] | None:
        starts = [i for i, text in enumerate(texts) if "QUEUE_SIZE" in text or "transfer_queues" in text]
        ends = [i for i, text in enumerate(texts) if "self.transfer_worker" in text]
        if not (starts and ends and starts[0] <= ends[-1]):
            raise SandboxError(f"{cls.__name__}.__init__: no prefill statements starting transfer_worker threads")
        return list(range(starts[0], ends[-1] + 1))

    return init_statements(cls, "PREFILL", select)


def decode_thread_start(cls: type):
    """The decode branch's statements that start threads (``self._start_..._thread()``, with the
    conditions around them: staging, deferred release), or None when it starts none."""

    def select(texts: list[str]) -> list[int]:
        return [i for i, text in enumerate(texts) if "_thread(" in text]

    return init_statements(cls, "DECODE", select)


# Statements of Mooncake's prefill branch that the sandbox does itself, and why:
MOONCAKE_PREFILL_SKIPPED = {
    "start_prefill_thread": "the loop starts the bootstrap thread itself",
    # Up to 0.5.2 the branch registers with the bootstrap server (host from the stubbed get_ip);
    # the twin registers with the release's own method once its server is up, the sandbox has none.
    "register_to_bootstrap": "registration is the twin's (BootstrapServer.register)",
    # Up to 0.5.2: get_pp_group() is torch.distributed (stubbed); the sandbox set a SingleRankGroup.
    "self.pp_group =": "the pipeline group is the sandbox's SingleRankGroup",
}


def mooncake_prefill_start(cls: type):
    """Mooncake's prefill branch without the statements in :data:`MOONCAKE_PREFILL_SKIPPED` (the
    loop starts the bootstrap thread itself): the session bookkeeping, the transfer queues, one
    ``ThreadPoolExecutor`` per queue, ``check_mooncake_custom_mem_pool_enabled``, the
    ``transfer_worker`` threads and (where the release has it and its setting is on) the
    failed-session probe. Every statement is the release's; the engine it uses is whatever the
    manager's ``engine`` is."""

    def select(texts: list[str]) -> list[int]:
        if not any("self.transfer_worker" in text for text in texts):
            raise SandboxError(f"{cls.__name__}.__init__: no prefill statements starting transfer_worker threads")
        return [i for i, text in enumerate(texts) if not any(skip in text for skip in MOONCAKE_PREFILL_SKIPPED)]

    return init_statements(cls, "PREFILL", select)
