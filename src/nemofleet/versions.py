"""One version parser for everything nemofleet compares (Docker, drivers, toolkit, CUDA)."""

from __future__ import annotations

import re

from .valuetypes import INT_MAX, host_number


def parse(text: str | None, parts: int = 4) -> tuple[int, ...]:
    """'25.0.3' -> (25, 0, 3); '580.159.04' -> (580, 159, 4); None/'' /'[N/A]' -> (0,)."""
    # ASCII digits only (a host prints the versions compared here: '٥٨٠' is no 580), each bounded
    return tuple(host_number(p, 0, INT_MAX) or 0 for p in re.findall(r"[0-9]+", text or "")[:parts]) or (0,)


def major(text: str | None) -> int:
    return parse(text)[0]


MIN_TOOLKIT = (1, 14)  # cgroup v2 needs >= 1.14; an older toolkit cannot generate a usable CDI spec
