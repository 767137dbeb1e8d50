"""The type of every HostFacts part, as the fact parsers check what a host printed: the typed
models of nemofleet.factmodel, where each part is declared once (the model the decision reads and
the spec a value is checked against are one declaration).

`part_problem(key, value)` is None for a value of the part's type, or one sentence naming the
first place it is not (a string where a list is, null where a mapping is, a GPU without a uuid,
a checkpoint config.json with a string where a number is). HostFacts.process and the facts-file
reader call it, so a malformed part refuses that host in one sentence, never with a traceback
further up.
"""

from __future__ import annotations

from ..factmodel import PARTS, part_problem  # noqa: F401
