"""The explicit, per-release list of modules the sandbox serves as stubs, and the stub objects.

Only modules that cannot load on a CPU-only machine without sglang's full dependency set
(torch, CUDA helpers, the server-args parser, distributed groups, tracing) are stubbed.
Everything under ``sglang.srt.disaggregation`` and ``sglang.srt.environ`` loads for real;
an import that matches neither the real set nor this table fails loudly
(:class:`~forensics.sandbox.errors.UnexpectedImport`), so a new dependency in a new
release shows up as an error naming the module, never as a silent stub.

A rule covers the named module and its sub-modules (a stub has no real children).
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclass(frozen=True)
class StubRule:
    module: str
    releases: str  # a PEP 440 specifier set, e.g. ">=0.5.13"
    why: str

    def applies_to(self, version: str) -> bool:
        return Version(version) in SpecifierSet(self.releases, prereleases=True)

    def covers(self, fullname: str) -> bool:
        return fullname == self.module or fullname.startswith(self.module + ".")


ALL = ">=0"

# Release ranges come from loading every 0.5.x wheel with both backends (the slow sweeps); a
# range covers what either backend's modules import. Keep the table minimal: tests/test_sandbox.py
# checks that each tested release (nixl) imports exactly the rules that apply.
STUB_RULES: tuple[StubRule, ...] = (
    StubRule("torch", ALL, "no torch on a CPU sandbox; only type hints and dist groups use it here"),
    StubRule("sglang.srt.server_args", ALL, "the full CLI/server config; the sandbox passes its own values"),
    StubRule("sglang.srt.utils", ALL, "CUDA/NPU probes and network helpers that pull in torch"),
    # mooncake/conn.py imports it in every release; nixl's modules from 0.5.3 on, except 0.5.21.
    StubRule("sglang.srt.distributed", ALL, "torch.distributed process groups"),
    StubRule("sglang.srt.layers", "<0.5.21", "attention TP/DP rank getters (the sandbox sets ranks itself)"),
    StubRule("sglang.srt.debug_utils", ">=0.5.9,<0.5.18", "CUDA core-dump env injection imported by environ.py"),
    StubRule("sglang.srt.observability", ">=0.5.13", "request tracing (OpenTelemetry)"),
    StubRule("sglang.srt.configs", ">=0.5.15.post1", "model configs (transformers), for a model-type check"),
    StubRule("sglang.srt.runtime_context", ">=0.5.16", "parallel-rank getters, read only by the managers' __init__"),
    StubRule("sglang.srt.mem_cache", ">=0.5.23", "GPU memory pools (a KV-slot helper)"),
)


def rules_for(version: str) -> list[StubRule]:
    return [rule for rule in STUB_RULES if rule.applies_to(version)]


class Stub:
    """A falsy placeholder for anything taken from a stubbed module.

    Falsy, so ``if is_hip():`` and ``if server_args.enable_x:`` take the plain-CPU
    branch; attribute access, calls and indexing give more stubs; as a decorator
    (called with one function or class) it returns the decorated object unchanged, so
    real sglang functions stay real; as a base class it stands for ``object``.
    """

    __slots__ = ("_stub_path",)

    def __init__(self, path: str) -> None:
        object.__setattr__(self, "_stub_path", path)

    def __getattr__(self, name: str) -> Stub:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Stub(f"{self._stub_path}.{name}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and (inspect.isfunction(args[0]) or inspect.isclass(args[0])):
            return args[0]
        return Stub(f"{self._stub_path}()")

    def __getitem__(self, key) -> Stub:
        return Stub(f"{self._stub_path}[...]")

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __iter__(self):
        return iter(())

    def __enter__(self) -> Stub:
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def __mro_entries__(self, bases):
        return (object,)

    # A stub stands for an unknown number too (ranks, sizes): every comparison is False,
    # which, like falsiness, keeps the code on its single-GPU, non-distributed branch.
    def __lt__(self, other) -> bool:
        return False

    __gt__ = __le__ = __ge__ = __lt__

    # ``isinstance(x, torch.Tensor)`` (0.5.23's Mooncake transfer_worker): nothing on a CPU
    # sandbox is an instance or subclass of a stubbed class.
    def __instancecheck__(self, instance) -> bool:
        return False

    def __subclasscheck__(self, subclass) -> bool:
        return False

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __repr__(self) -> str:
        return f"<sandbox stub {self._stub_path}>"


class StubModule(types.ModuleType):
    """A stubbed module: every attribute is a :class:`Stub` named after it."""

    def __getattr__(self, name: str) -> Stub:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = Stub(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value
