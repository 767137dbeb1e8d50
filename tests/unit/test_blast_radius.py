"""Nothing one host reports changes the commands run on another, except typed values (issue 36).

A serving group's head address, as read from the head, reaches every worker's unit and health
script; a GPU UUID reaches `docker run --gpus`; a seed key file reaches authorized_keys. Each is
typed at the edge (factmodel.py, secret.py) and then only ever an argument.
"""

from __future__ import annotations

import subprocess

import pytest

from nemofleet import render, settings
from nemofleet import factmodel as schema
from nemofleet.facts.docker import HostAddresses
from nemofleet.facts.host import read_part
from nemofleet.multinode import member_address

HOSTILE_SCOPES = ["$(touch /tmp/nf-pwned)", "eth0;id", "a b", "x'y", "`id`", "eth0/../x", "a\nb", "%", ""]


@pytest.mark.parametrize("scope", HOSTILE_SCOPES)
def test_an_address_with_a_hostile_scope_id_refuses_that_host_at_the_edge(scope):
    value, why = read_part("addresses", HostAddresses(), [f"eth0 fd00::1%{scope}/64"])
    # refused in one sentence (the host alone), or the line is not an `ip -o addr` line at all and
    # is dropped: either way no address with that text is left for a decision to read
    assert (why and "addresses" in why and value == {}) or all(
        schema.part_problem("addresses", {k: [a]}) is None for k, v in value.items() for a in v), (value, why)
    assert not any(scope and scope in a for v in value.values() for a in v)


def test_a_plain_scope_id_is_read_and_never_reaches_a_command_line():
    value, why = read_part("addresses", HostAddresses(), ["eth0 fd00::7%eth0/64", "lo 127.0.0.1/8"])
    assert why is None and value["eth0"] == ["fd00::7%eth0"]
    s = settings.parse({})
    assert member_address(value, s) == ("eth0", "fd00::7")  # the scope id is dropped


@pytest.mark.parametrize("iface", ["eth0;id", "$(id)", "a b", "x" * 16])
def test_an_interface_name_that_is_not_one_is_refused(iface):
    assert schema.part_problem("addresses", {iface: ["10.0.0.1"]})


@pytest.mark.parametrize("uuid", ["GPU-0,count=all", "GPU-a", "GPU-52f85421-656d-13c5-c3e9-04deeba4a042,x",
                                  "GPU-52f85421-656d-13c5-c3e9-04deeba4a04\n", "MIG-1", 7])
def test_a_gpu_uuid_not_in_nvidia_smis_format_is_refused(uuid):
    gpu = {"index": 0, "uuid": uuid, "name": "NVIDIA H200", "memory_mib": 143771}
    assert "uuid" in schema.part_problem("gpus", {"driver": "580.95.05", "gpus": [gpu]})


def test_real_uuids_and_bus_ids_pass():
    gpu = {"index": 0, "uuid": "GPU-52f85421-656d-13c5-c3e9-04deeba4a042", "name": "NVIDIA H200",
           "memory_mib": 143771, "bus_id": "00000000:00:06.0"}
    assert schema.part_problem("gpus", {"driver": "580.95.05", "gpus": [gpu]}) is None
    assert "bus_id" in schema.part_problem("gpus", {"driver": "580", "gpus": [dict(gpu, bus_id="0:0:6,x")]})


def test_the_workers_wait_for_the_head_takes_the_address_as_an_argument(tmp_path):
    """The ExecStartPre program is constant; even a value that is not an address stays data."""
    marker = tmp_path / "pwned"
    argv = render.join_wait(f"$(touch {marker})", 9, 2)
    assert argv[:4] == ["/usr/bin/timeout", "2", "/bin/bash", "-c"] and argv[4] == render.JOIN_WAIT_SCRIPT
    subprocess.run(["timeout", "2", "bash", "-c", argv[4], argv[5], argv[6], argv[7]], capture_output=True)
    assert not marker.exists()
