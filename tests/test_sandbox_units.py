"""Pure-Python parts of the sandbox: stub objects, the stub table, __init__ defaults (no sglang)."""

from __future__ import annotations

import collections
import threading

import pytest

from forensics.sandbox.init_defaults import assigned_in_init, initial_values, missing_attribute_gap
from forensics.sandbox.stubs import STUB_RULES, Stub, StubModule, rules_for


class Status:
    pass


class Base:
    def __init__(self, sock):
        self.request_status = {}
        self.lock = threading.Lock()
        self.sock = sock  # not a literal: left to the sandbox
        self.name = "base"


class Manager(Base):
    def __init__(self, sock, mode):
        super().__init__(sock)
        self.name = "manager"
        if mode:
            self.tracker = collections.defaultdict(set)
            self.statuses: dict = collections.defaultdict(Status)
        self.timeout = compute_timeout()  # noqa: F821  (never evaluated: a call of unknown code)


def test_initial_values_take_literals_and_empty_containers_from_every_init_in_the_mro():
    values = initial_values(Manager)
    assert values["request_status"] == {} and values["name"] == "manager"
    assert isinstance(values["lock"], type(threading.Lock()))
    assert values["tracker"]["x"] == set()
    assert isinstance(values["statuses"]["room"], Status)
    assert "sock" not in values and "timeout" not in values
    assert values["request_status"] is not initial_values(Manager)["request_status"]  # fresh each time
    # Every attribute any __init__ in the MRO assigns, literal or not, branch taken or not.
    assert assigned_in_init(Manager) == {"request_status", "lock", "sock", "name", "tracker", "statuses", "timeout"}


def test_missing_attribute_gap_only_for_attributes_an_init_sets():
    message = "'Manager' object has no attribute 'timeout'"
    assert missing_attribute_gap("AttributeError", message, [Manager]) == "Manager.timeout"
    assert missing_attribute_gap("AttributeError", "'Manager' object has no attribute 'other'", [Manager]) is None
    assert missing_attribute_gap("AssertionError", message, [Manager]) is None


def test_stubs_are_falsy_callable_decorators_and_bases():
    stub = Stub("torch.cuda")
    assert not stub and not stub.is_available() and len(stub) == 0 and list(stub) == []
    assert not (stub > 1) and not (stub < 1)

    def function():
        return 42

    assert stub(function) is function  # used as a decorator, the real function survives

    class Derived(Stub("torch.nn.Module")):
        pass

    assert Derived.__mro__[1] is object
    module = StubModule("sglang.srt.utils")
    assert repr(module.get_int_env_var) == "<sandbox stub sglang.srt.utils.get_int_env_var>"
    with pytest.raises(AttributeError):
        _ = module.__wrapped__


def test_stub_rules_are_selected_by_release():
    assert {r.module for r in rules_for("0.5.1")} == {
        "torch", "sglang.srt.server_args", "sglang.srt.utils", "sglang.srt.distributed", "sglang.srt.layers"}
    assert "sglang.srt.layers" in {r.module for r in rules_for("0.5.20")}
    assert "sglang.srt.layers" not in {r.module for r in rules_for("0.5.21")}
    assert "sglang.srt.configs" not in {r.module for r in rules_for("0.5.15")}
    assert "sglang.srt.configs" in {r.module for r in rules_for("0.5.15.post1")}
    assert all(rule.why for rule in STUB_RULES)
    rule = next(r for r in STUB_RULES if r.module == "torch")
    assert rule.covers("torch.distributed") and not rule.covers("torchvision")
