"""Reboot a host (after a driver install) and wait until it is back; never the controller.

pyinfra's server.reboot confirms a reboot by a lower /proc/uptime, which containers and some
virtual machines do not reset. Here a marker in /run (a tmpfs, emptied by every boot) says
whether the host really went down, and systemd must have finished starting it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, StringCommand, operation

from ..facts.machine import MachineId
from . import fail_command

MARKER = "/run/nemofleet/reboot-pending"


def local_machine_id() -> str | None:
    try:
        return Path("/etc/machine-id").read_text().strip() or None
    except OSError:
        return None


def is_controller(connector_name: str, remote_id: str | None) -> bool:
    """True when the host is the machine pyinfra runs on (@local, or SSH back to itself)."""
    return connector_name == "local" or (remote_id is not None and remote_id == local_machine_id())


def _wait(state, host, timeout: float, interval: float) -> bool:  # pragma: no cover (needs a reboot)
    # while the host is down, paramiko logs each refused handshake with a traceback: not news
    quiet = logging.getLogger("paramiko")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        host.disconnect()
        deadline = time.time() + timeout
        while time.time() < deadline:
            time.sleep(interval)
            host.connect(show_errors=False)
            if not host.connected:
                continue
            ok, out = host.run_shell_command(StringCommand(
                "sh", "-c", f"'test ! -e {MARKER} && systemctl is-system-running --wait >/dev/null 2>&1; "
                f"test ! -e {MARKER}'"))
            if ok:
                host.log(f"back after the reboot ({timeout - (deadline - time.time()):.0f} s)", logger.info)
                return True
            host.disconnect()
        host.log(f"did not come back within {timeout:.0f} s of the reboot; check its console", logger.error)
        return False
    finally:
        quiet.setLevel(level)


@operation(is_idempotent=False)
def reboot_and_wait(why: str, timeout: int = 900, interval: int = 3):
    """Reboot now and wait for SSH and systemd; add it only when the facts say a reboot is needed."""
    connector = getattr(host.connector_cls, "__name__", "").lower().replace("connector", "")
    if is_controller(connector, host.get_fact(MachineId)):
        yield fail_command(f"{host.name} is the machine nemofleet runs on; it never reboots it ({why}): "
                           "reboot it yourself, then run the deploy again")
        return
    host.log(f"rebooting: {why}", logger.warning)
    yield StringCommand("sh", "-c", f"'mkdir -p /run/nemofleet && touch {MARKER} && "
                        "(sleep 2 && systemctl reboot) </dev/null >/dev/null 2>&1 &'")
    yield FunctionCommand(_wait, (timeout, interval), {})
