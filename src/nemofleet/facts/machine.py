"""Facts read by nemofleet's own operations (moved here so every fact lives in facts/)."""

from __future__ import annotations

from pyinfra.api import FactBase


class MachineId(FactBase):
    command = "cat /etc/machine-id 2>/dev/null || true"

    def process(self, output):
        return "".join(output).strip() or None
