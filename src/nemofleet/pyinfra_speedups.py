"""Controller speed: pyinfra's per-operation call-site lookup without reading source files, its
global-argument list read once, and the host data those arguments come from merged once per call.

pyinfra orders operations by the line numbers of the deploy code that called them
(`pyinfra.api.util.get_operation_order_from_stack`, run once per operation per host). It gets
them with `inspect.stack()` and `getframeinfo()` on every frame, which look up each frame's
module by scanning `sys.modules` (`inspect.getmodule`) and read its source lines: about half a
millisecond per operation, a third of the controller's own CPU on a no-op run (bench/profile.py).
`operation_order_from_stack` returns the same list from the frames themselves (file name and
line of each frame, the same values `getframeinfo` gives); `install()` puts it in pyinfra's
operation module.

pyinfra also lists its global arguments (`_sudo`, `_if`, ...) for every operation call on every
host (`pyinfra.api.arguments.all_global_arguments`, from `pop_global_arguments`) with
`typing.get_type_hints` on the fixed `AllArguments` TypedDict, which compiles each string
annotation anew: 0.15 ms per call, about 38 calls per host on a no-op (docs/measurements.md).
`global_arguments` gives the same list, read once per process.

For each of those arguments it then looks the name up in the host's data (`getattr(host.data,
key)`), and each lookup walks every data layer (override, host, each group merged anew, global,
deploy), catching a KeyError per layer that lacks it. `pop_global_arguments` gives pyinfra's
function a view of the host whose data is the layers merged once for that call (`HostData.dict()`,
pyinfra's own merge, in the same precedence as its lookups): 0.29 -> 0.20 ms per call with a small
inventory. Nothing else changes; tests/unit/test_speed.py checks both agree.
"""
from __future__ import annotations

import importlib
import inspect
import sys
import traceback
from copy import copy

import pyinfra
from pyinfra.api import util as _util

_operation = importlib.import_module("pyinfra.api.operation")  # the module (pyinfra.api.operation is also a function)

_arguments = importlib.import_module("pyinfra.api.arguments")
_facts = importlib.import_module("pyinfra.api.facts")
_deploy = importlib.import_module("pyinfra.api.deploy")

_original = _util.get_operation_order_from_stack
_original_arguments = _arguments.all_global_arguments
_original_pop = _arguments.pop_global_arguments
_ARGUMENTS: list[tuple[str, type]] = []


def _lineno(frame) -> int:
    """The line `inspect.getframeinfo(frame).lineno` gives: the current instruction's start line."""
    pos = getattr(inspect, "_get_code_position")(frame.f_code, frame.f_lasti)  # what getframeinfo uses (3.11+)
    return pos[0] if pos[0] is not None else frame.f_lineno


def operation_order_from_stack(state, _frame=None) -> list[int]:
    """`pyinfra.api.util.get_operation_order_from_stack(state)`, from the frames alone."""
    frames = [fr for fr, _ in traceback.walk_stack(_frame or sys._getframe(1))][::-1]
    i = 0
    if state.current_deploy_filename:
        i = next((i for i, fr in enumerate(frames) if fr.f_code.co_filename == state.current_deploy_filename),
                 len(frames))  # not on the stack: pyinfra's loop ends on its own frame (last), which it then skips
    line_numbers = []
    if pyinfra.is_cli:
        line_numbers.append(state.current_op_file_number)
    for fr in frames[i:]:
        if fr.f_code.co_filename.startswith(_util.PYINFRA_INSTALL_DIR):
            continue
        line_numbers.append(_lineno(fr))
    return line_numbers


def global_arguments() -> list[tuple[str, type]]:
    """`pyinfra.api.arguments.all_global_arguments()`: the same (name, type) pairs, a new list each
    call (as pyinfra's), evaluated once."""
    if not _ARGUMENTS:
        _ARGUMENTS.extend(_original_arguments())
    return list(_ARGUMENTS)


class _MergedData:
    """`host.data` as pyinfra's HostData answers it (a shallow copy of the value of the first layer
    that has the name, AttributeError when none has), from the layers merged once."""

    def __init__(self, data):
        self._merged = data.dict()

    def __getattr__(self, key):
        try:
            return copy(self._merged[key])
        except KeyError:
            raise AttributeError(key) from None

    def get(self, key, default=None):
        return getattr(self, key, default)


class _HostView:
    """The host as `pop_global_arguments` reads it: its data merged once, the rest the host's."""

    def __init__(self, host):
        self._host = host
        self.data = _MergedData(host.data)

    def __getattr__(self, name):
        return getattr(self._host, name)


def pop_global_arguments(state, host, kwargs):
    """`pyinfra.api.arguments.pop_global_arguments`, its host data read from one merge."""
    return _original_pop(state, _HostView(host), kwargs)


def install() -> None:
    """Use operation_order_from_stack, global_arguments and pop_global_arguments for every
    operation of this run (idempotent)."""
    if hasattr(inspect, "_get_code_position"):  # else pyinfra's own, unchanged
        setattr(_operation, "get_operation_order_from_stack", operation_order_from_stack)
    setattr(_arguments, "all_global_arguments", global_arguments)  # pop_global_arguments looks it up here
    setattr(_facts, "all_global_arguments", global_arguments)  # facts.py imported the name itself
    for module in (_operation, _facts, _deploy):  # each imported pop_global_arguments itself
        setattr(module, "pop_global_arguments", pop_global_arguments)
