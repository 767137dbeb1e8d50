"""One version parser for everything nemofleet compares (Docker, drivers, toolkit, CUDA)."""

from __future__ import annotations

import re


def parse(text: str | None, parts: int = 4) -> tuple[int, ...]:
    """'25.0.3' -> (25, 0, 3); '580.159.04' -> (580, 159, 4); None/'' /'[N/A]' -> (0,)."""
    return tuple(int(p) for p in re.findall(r"\d+", text or "")[:parts]) or (0,)


def major(text: str | None) -> int:
    return parse(text)[0]
