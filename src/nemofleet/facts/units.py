"""Facts read by nemofleet's own operations (moved here so every fact lives in facts/)."""

from __future__ import annotations

from .. import shell  # the one quoting boundary

from . import Fact

from ..paths import UNIT_GLOB


class UnitStates(Fact):
    """{"units": {unit: {"enabled": bool, "active": bool}}, "files": [installed nemofleet units]}."""

    def command(self, units: tuple[str, ...]) -> str:
        # one systemctl for every unit (blocks in argument order, each with its Id): not two per unit
        q = " ".join(shell.quote(u) for u in units)
        return (f"{{ timeout 60 systemctl show -p Id,UnitFileState,ActiveState -- {q} 2>/dev/null; echo; }} | "
                "while IFS= read -r l; do case $l in Id=*) u=${l#Id=};; UnitFileState=*) e=${l#UnitFileState=};; "
                "ActiveState=*) a=${l#ActiveState=};; '') [ -n \"$u\" ] && echo \"unit $u ${e:--} ${a:--}\"; "
                "u=; e=; a=;; esac; done; "
                f"for f in {UNIT_GLOB}; do [ -e \"$f\" ] && echo \"file $(basename $f)\"; done; true")

    def parse(self, output):
        units: dict[str, dict] = {}
        files: list[str] = []
        for line in output:
            parts = line.split()
            if len(parts) < 2:
                continue  # not a line of the listing (a bare "unit": a unit name cannot be empty)
            if parts[:1] == ["unit"]:
                units[parts[1]] = {"enabled": parts[2:3] == ["enabled"],
                                          "active": parts[3:4] == ["active"] or parts[2:3] == ["active"]}
            elif parts[:1] == ["file"]:
                files.append(parts[1])
        return {"units": units, "files": files}
