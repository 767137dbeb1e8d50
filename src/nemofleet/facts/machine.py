"""Facts read by nemofleet's own operations (moved here so every fact lives in facts/)."""

from __future__ import annotations

from . import Fact


class MachineId(Fact):
    def command(self) -> str:
        return "cat /etc/machine-id 2>/dev/null || true"

    def parse(self, output):
        return "".join(output).strip() or None
