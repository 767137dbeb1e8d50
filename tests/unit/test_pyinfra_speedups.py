"""nemofleet.pyinfra_speedups: the call-site lookup gives pyinfra's own operation order, from the frames alone."""
from types import SimpleNamespace

import pyinfra

from nemofleet import pyinfra_speedups as speed

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


def _inventory_state():
    from pyinfra.api import Config, Inventory, State

    inventory = Inventory(
        ([("h1", {"_sudo": True, "_sudo_user": "ops", "x": [1]}), ("h2", {})], {"_timeout": 30, "_shell_executable": "bash"}),
        gpu_h100=(["h1"], {"_timeout": 5, "_env": {"A": "1"}}),
        gpu_a100=(["h2"], {"_retries": 2}),
    )
    state = State(inventory, Config())
    inventory.override_data["_sudo_user"] = "root"  # as `--data` gives it: above every layer
    return inventory, state


def test_pop_global_arguments_reads_the_same_values_as_pyinfras_own():
    """pyinfra's function with the host's data merged once gives what it gives on its own: for
    arguments given, arguments from each data layer (override, host, group, global), defaults."""
    inventory, state = _inventory_state()
    for name in ("h1", "h2"):
        host = inventory.get_host(name)
        for kwargs in ({}, {"_sudo": False, "_if": [bool]}, {"_timeout": 7, "name": "op", "files": {}}):
            a, b = dict(kwargs), dict(kwargs)
            assert speed.pop_global_arguments(state, host, a) == speed._original_pop(state, host, b), (name, kwargs)
            assert a == b  # the same arguments popped from the operation's keywords
    got, _ = speed.pop_global_arguments(state, inventory.get_host("h1"), {})
    assert (got["_sudo"], got["_sudo_user"], got["_timeout"], got["_env"]) == (True, "root", 5, {"A": "1"})
    got, _ = speed.pop_global_arguments(state, inventory.get_host("h2"), {})
    assert (got["_sudo"], got["_timeout"], got["_retries"], got["_shell_executable"]) == (False, 30, 2, "bash")


def test_merged_data_copies_like_host_data():
    inventory, _ = _inventory_state()
    host = inventory.get_host("h1")
    view = speed._HostView(host)
    assert view.data.x == host.data.x == [1] and view.data.x is not host.data.x
    assert view.data.get("nope", 3) == 3 and view.name == "h1"
    view.data.x.append(2)
    assert host.data.x == [1]


def test_install_puts_the_argument_reader_where_pyinfra_calls_it(monkeypatch):
    for module in (speed._operation, speed._facts, speed._deploy):
        monkeypatch.setattr(module, "pop_global_arguments", speed._original_pop)
    speed.install()
    assert all(m.pop_global_arguments is speed.pop_global_arguments
               for m in (speed._operation, speed._facts, speed._deploy))
