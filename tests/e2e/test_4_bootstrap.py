"""A GPU host from nothing (bare-1: no driver, no container toolkit): nemofleet installs both
from the (simulated) NVIDIA apt repository, pinned and held, reboots into the driver, runs
preflight again and converges the host to serving; the second run changes nothing."""
import json
import time

import pytest

from conftest import on, optional_host, pyinfra

pytestmark = pytest.mark.e2e
HOST = "bare-1"
DRIVER = ["nvidia-driver-580-server", "nvidia-utils-580-server"]
TOOLKIT = ["libnvidia-container-tools", "libnvidia-container1", "nvidia-container-toolkit",
           "nvidia-container-toolkit-base"]


bare = optional_host(HOST)


def test_bad_install_settings_refused_before_anything_changes(bare):
    r = pyinfra(hosts=[HOST], data={"container_toolkit_version": "latest please"})
    assert r.rc == 1
    assert "container_toolkit_version must be a pinned package version such as '1.18.0-1'" in r.out
    r = pyinfra(hosts=[HOST], data={"nvidia_driver_key_file": "/nonexistent/key.asc"})
    assert r.rc == 1 and "nvidia_driver_key_file /nonexistent/key.asc cannot be read on the controller" in r.out
    assert on(HOST, "ls /etc/apt/sources.list.d/ /etc/apt/preferences.d/").stdout.split() == \
        ["/etc/apt/preferences.d/:", "/etc/apt/sources.list.d/:"]
    assert "nvidia-smi" not in on(HOST, "ls /usr/bin").stdout


def test_host_from_nothing_to_serving_then_zero_changes(bare):
    boot_before = on(HOST, "systemctl show -p ActiveEnterTimestampMonotonic --value basic.target; "
                           "cat /proc/1/stat | cut -d' ' -f22").stdout
    t0 = time.time()
    r = pyinfra(hosts=[HOST], timeout=1200)
    took = time.time() - t0
    assert r.rc == 0, r.out[-6000:]
    changed = " | ".join(r.changed())
    for op in ("NVIDIA driver 580 (pinned, held)", "Reboot into NVIDIA driver 580",
               "NVIDIA Container Toolkit 1.18.0-1 (pinned, held)", "Preflight and converge on the freshly installed host"):
        assert op in changed, changed
    assert "rebooting: NVIDIA driver 580 was installed" in r.out
    # it really rebooted (a new PID 1) and runs the newest driver of the pinned branch
    assert on(HOST, "systemctl show -p ActiveEnterTimestampMonotonic --value basic.target; "
                    "cat /proc/1/stat | cut -d' ' -f22").stdout != boot_before
    assert on(HOST, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.strip() == "580.159.04"
    assert "version 1.18.0" in on(HOST, "nvidia-ctk --version").stdout  # the pin, not the newest 1.18.1
    held = on(HOST, "apt-mark showhold").stdout.split()
    assert sorted(held) == sorted(DRIVER + TOOLKIT)
    assert "signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg" in \
        on(HOST, "cat /etc/apt/sources.list.d/nvidia-container-toolkit.list").stdout
    assert json.loads(on(HOST, "cat /etc/docker/daemon.json").stdout)["runtimes"]["nvidia"]["path"] == \
        "nvidia-container-runtime"
    assert on(HOST, "systemctl is-active nemofleet-vllm-nemotron-0").stdout.strip() == "active"
    assert on(HOST, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health").stdout == "200"
    print(f"bare host to serving in {took:.1f} s")
    again = pyinfra(hosts=[HOST])
    assert again.rc == 0 and again.changed() == [], again.changed()


def test_toolkit_pin_change_upgrades_and_keeps_the_hold(bare):
    r = pyinfra(hosts=[HOST], data={"container_toolkit_version": "1.18.1-1"})
    assert r.rc == 0, r.out[-4000:]
    assert "version 1.18.1" in on(HOST, "nvidia-ctk --version").stdout
    assert "Reboot" not in " ".join(r.changed())  # the driver did not change: no reboot
    assert sorted(on(HOST, "apt-mark showhold").stdout.split()) == sorted(DRIVER + TOOLKIT)
    assert pyinfra(hosts=[HOST], data={"container_toolkit_version": "1.18.1-1"}).changed() == []


def test_never_reboots_the_controller():
    from nemofleet.operations.reboot import is_controller, local_machine_id

    assert is_controller("local", None)
    assert is_controller("ssh", local_machine_id()) == (local_machine_id() is not None)
    assert not is_controller("ssh", "0" * 32)
