"""Controller speed: pyinfra's per-operation call-site lookup without reading source files, and
its global-argument list read once.

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
annotation anew: about 1.5 ms per operation, a quarter of the controller's CPU per host on a no-op
(cProfile of the testbed's no-op, 2026-12-04). `global_arguments` gives the same list, read once
per process. Nothing else changes; tests/unit/test_speed.py checks both agree.
"""
from __future__ import annotations

import importlib
import inspect
import sys

import pyinfra
from pyinfra.api import util as _util

_operation = importlib.import_module("pyinfra.api.operation")  # the module (pyinfra.api.operation is also a function)

_arguments = importlib.import_module("pyinfra.api.arguments")
_facts = importlib.import_module("pyinfra.api.facts")

_original = _util.get_operation_order_from_stack
_original_arguments = _arguments.all_global_arguments
_ARGUMENTS: list[tuple[str, type]] = []


def _lineno(frame) -> int:
    """The line `inspect.getframeinfo(frame).lineno` gives: the current instruction's start line."""
    pos = inspect._get_code_position(frame.f_code, frame.f_lasti)  # what getframeinfo uses (3.11+)
    return pos[0] if pos[0] is not None else frame.f_lineno


def operation_order_from_stack(state, _frame=None) -> list[int]:
    """`pyinfra.api.util.get_operation_order_from_stack(state)`, from the frames alone."""
    frames = []
    f = _frame or sys._getframe(1)
    while f is not None:
        frames.append(f)
        f = f.f_back
    frames.reverse()
    i = 0
    if state.current_deploy_filename:
        for i, fr in enumerate(frames):
            if fr.f_code.co_filename == state.current_deploy_filename:
                break
        else:  # not on the stack: pyinfra's loop ends on its own frame (last), which it then skips
            i = len(frames)
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


def install() -> None:
    """Use operation_order_from_stack and global_arguments for every operation of this run
    (idempotent)."""
    if hasattr(inspect, "_get_code_position"):  # else pyinfra's own, unchanged
        _operation.get_operation_order_from_stack = operation_order_from_stack
    _arguments.all_global_arguments = global_arguments  # pop_global_arguments looks it up here
    _facts.all_global_arguments = global_arguments  # facts.py imported the name itself
