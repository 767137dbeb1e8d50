"""pyinfra facts nemofleet reads from GPU hosts.

Every fact exits 0 and reports absence on stdout, so a missing tool never fails the host
(pyinfra runs a fact command per call: no caching). `host.HostFacts` runs all host-level facts in one remote command.

Every fact is a `Fact`, and reading what a host printed is total by construction: a fact
defines `parse(lines)`, which returns its value or raises Unreadable with one sentence (and the
value it reports for that case); `Fact.read_output` -- the one wrapper, which no fact can replace
(`process` is refused in a subclass) -- turns whatever else parse() raises on output it did not
foresee into one sentence too. HostFacts refuses the host in that sentence (its `errors`);
a fact read on its own gives pyinfra its fallback value, or FactProcessError, which fails that
host alone (any other exception would abort the run for every host).
"""

from __future__ import annotations

import copy

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from ..factmodel import Facts
from ..valuetypes import Unreadable, shown


# the HostFacts parts, {part: (fact class, its arguments)}, as the facts declare them
PARTS: dict[str, tuple[type, dict]] = {}
# each part's value when its host printed nothing: its factmodel.Facts default, as JSON (lists)
DEFAULTS = Facts().model_dump(mode="json")


class Fact(FactBase):
    """A nemofleet fact: `parse(lines)` reads the host's output (pyinfra's `process` is Fact's)."""

    part: str | None = None  # the HostFacts part it is (`part=`)
    empty: object = None  # the value of a fact of no part when its host printed nothing

    def __init_subclass__(cls, part: str | None = None, reads: dict | None = None, **kwargs):
        """`class X(Fact, part="gpus", reads={...})`: X is the HostFacts part `gpus` (a field of
        factmodel.Facts), run with these arguments (a name of HostFacts.ARGS stands for its value).
        A part is declared where its fact is, so adding one is that fact and its Facts field."""
        super().__init_subclass__(**kwargs)
        if part is not None:
            PARTS[part] = (cls, reads or {})
            cls.part = part
        if "process" in vars(cls):
            raise TypeError(f"{cls.__name__} defines process(): a nemofleet fact defines parse(), and "
                            "Fact.process reads it (facts/__init__.py)")

    def default(self):  # type: ignore[override]
        """pyinfra's value for no output: a part's factmodel.Facts default (declared once, there),
        else the fact's `empty`."""
        return copy.deepcopy(DEFAULTS[self.part] if self.part else self.empty)

    def parse(self, output: list[str]):
        """The value of what the host printed (pyinfra's own: the text)."""
        return "\n".join(output)

    def read_output(self, output: list[str]) -> tuple[object, str | None]:
        """(value, None), or (the fact's value for that case, one sentence) when parse() raised
        Unreadable; FactProcessError with one sentence for any other exception."""
        if not output:
            return self.default(), None  # as pyinfra: parse() is never called on no output
        try:
            return self.parse(output), None
        except Unreadable as exc:
            return (self.default() if exc.value is None else exc.value), str(exc)
        except Exception as exc:  # noqa: BLE001 - output parse() did not foresee: one sentence, this host only
            first = next((ln.strip() for ln in output if isinstance(ln, str) and ln.strip()), "")
            raise FactProcessError(
                f"the {type(self).__name__} check printed output nemofleet cannot read ({type(exc).__name__}; "
                f"first line {shown(first)}); run `pyinfra HOST fact {type(self).__module__}.{type(self).__name__}` "
                "to see it") from None

    def process(self, output: list[str]):
        return self.read_output(output)[0]
