"""nemofleet.speed: the call-site lookup gives pyinfra's own operation order, from the frames alone."""
from types import SimpleNamespace

import pyinfra

from nemofleet import speed

pyinfra_operation = speed._operation


def both(state):
    return speed._original(state), speed.operation_order_from_stack(state)  # one line: one call site


def nested(state, depth):
    if depth:
        return nested(state,
                      depth - 1)  # a call over two lines: getframeinfo's line is where the call starts
    return both(state)


def test_same_order_as_pyinfra(monkeypatch):
    for cli in (False, True):
        monkeypatch.setattr(pyinfra, "is_cli", cli)
        for deploy_file in (__file__, None, "/nowhere/deploy.py"):
            state = SimpleNamespace(current_deploy_filename=deploy_file, current_op_file_number=7)
            for depth in (0, 3):
                original, fast = nested(state, depth)
                assert fast == original, (cli, deploy_file, depth)
                if deploy_file == __file__:
                    assert len(original) >= 2  # the test's own frames are counted


def test_install_replaces_only_the_lookup(monkeypatch):
    monkeypatch.setattr(pyinfra_operation, "get_operation_order_from_stack", speed._original)
    speed.install()
    assert pyinfra_operation.get_operation_order_from_stack is speed.operation_order_from_stack


def test_global_arguments_are_pyinfras_own(monkeypatch):
    """The list read once is the list pyinfra evaluates on every call; install() puts it where
    pyinfra's operation and fact code look it up."""
    assert speed.global_arguments() == speed._original_arguments()
    assert speed.global_arguments() is not speed.global_arguments()  # a new list, as pyinfra's
    monkeypatch.setattr(speed._arguments, "all_global_arguments", speed._original_arguments)
    monkeypatch.setattr(speed._facts, "all_global_arguments", speed._original_arguments)
    speed.install()
    assert speed._arguments.all_global_arguments is speed.global_arguments
    assert speed._facts.all_global_arguments is speed.global_arguments
    assert "_sudo" in [name for name, _ in speed._arguments.all_global_arguments()]
