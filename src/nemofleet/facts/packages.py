"""Facts read by nemofleet's own operations (moved here so every fact lives in facts/)."""

from __future__ import annotations

from .. import shell  # the one quoting boundary

from . import Fact


class AptPackages(Fact):
    """{name: {"version": str or None, "held": bool}} for each package name."""

    def command(self, names: tuple[str, ...]) -> str:
        q = " ".join(shell.quote(n) for n in names)
        return (f"dpkg-query -W -f='pkg ${{Package}} ${{Version}} ${{db:Status-Abbrev}}\\n' {q} 2>/dev/null; "
                f"apt-mark showhold {q} 2>/dev/null | sed 's/^/held /'; true")

    empty: dict = {}

    def parse(self, output):
        out: dict = {}
        for line in output:
            parts = line.split()
            if parts[:1] == ["pkg"] and len(parts) >= 4:
                installed = parts[3][1:2] == "i"  # "ii" installed, "hi" installed and held
                out.setdefault(parts[1], {"held": False})["version"] = parts[2] if installed else None
            elif parts[:1] == ["held"] and len(parts) == 2:
                out.setdefault(parts[1], {"version": None})["held"] = True
        return out
