"""Programs that run on the hosts, one real file each (standard library only).

Each file here is a whole program: `python3 -I -S <file> ARGS` runs it, and so does
`python3 -I -S -c <its text> ARGS`, which is how nemofleet sends it (`argv`). The text travels
in the command itself because facts run before anything is uploaded, and a converged host's
no-op must stay at its two remote commands (docs/measurements.md): sending the program costs no
extra round trip, uploading it would. Every value a program needs reaches it as an argument
(or from a file it reads on the host, e.g. the 0600 token file); no value is ever formatted
into a program's source, and the shell line is built by shell.join.

-I: no PYTHON* variables and no user site; -S: no site module (a third of a python start's CPU
on every converged host's no-op; docs/measurements.md). The programs import only the standard
library and never each other (each one is sent alone).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

PYTHON = ("python3", "-I", "-S", "-c")


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """The text of the program `name` (a file of this package, e.g. "weights_check")."""
    return resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")


def argv(name: str, *args) -> list[str]:
    """The argument list that runs the program `name` on a host with `args` (each one word)."""
    return [*PYTHON, source(name), *(str(a) for a in args)]
