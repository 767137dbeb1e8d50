"""Programs that run on the hosts, one real file each (standard library only).

Each file here is a program, sent as `python3 -I -S -c <its text> ARGS` (`argv`). The text
travels in the command itself because facts run before anything is uploaded, and a converged
host's no-op must stay at its two remote commands (docs/measurements.md): sending the program costs no
extra round trip, uploading it would. Every value a program needs reaches it as an argument
(or from a file it reads on the host, e.g. the 0600 token file); no value is ever formatted
into a program's source, and the shell line is built by shell.join.

-I: no PYTHON* variables and no user site; -S: no site module (a third of a python start's CPU
on every converged host's no-op; docs/measurements.md). The programs import only the standard
library and never each other (each one is sent alone).

The prelude. What every program must do the same way with what the host holds -- open a file
without following a link and without waiting on a FIFO, replace a file by a temporary one and a
rename, remove a tree without following its links, keep a whole-run deadline, and speak HTTP by
one rule (http(s) only, bounded redirects that drop the API key when they leave its origin, a
bounded body) -- is written once, in _prelude.py, and `source` sends it before each program's
text (after a `#!` line, which stays first: the health program is installed as a file). A shared
module cannot be imported (nothing is uploaded), and a copy in each program is how the programs
came to differ (lock read its info with O_NOFOLLOW and O_NONBLOCK, weights_check without
O_NOFOLLOW, release and smoke with a plain open that waits on a FIFO; hub dropped the key on a
redirect to another host, smoke and metrics followed one with it). What a program runs is
therefore `source(name)`, not the file alone: the tests run that text, as the hosts do. The prelude imports only os, stat and time, which a
bare `import os` loads anyway (json and urllib are imported where they are used); its file part
costs about a millisecond of compile per start, and its deadline and HTTP part is sent only to the
programs that speak HTTP. Two programs use none of it and are sent without it (BARE): engine_read,
which reads no file and runs twice on every converged no-op (its HTTP is dockerd's unix socket,
bounded by its own whole-run deadline), and gpu_return, which only unlinks plain names in the
health state directory (unlink never follows a link) and runs bounded commands.

Deadlines. A program that waits on a server (hub, metrics, smoke; engine_read on its own) takes
the seconds its whole run may take as an argument, and the controller's bound around it (`timeout`
or the SSH step's) is a few seconds above: the program ends first, with its own answer. The
prelude's deadline() is an alarm, so a read that a trickling server keeps busy ends too, which a
socket timeout per read would not do. The programs that only read and write the host's files
(weights_check, models_on_disk, host_status, release, lock) wait on nothing once no FIFO is opened
for long: their calls of other commands are bounded one by one, and the controller's bound (its
`timeout`, or the SSH step's) bounds the rest (a hung NFS mount).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

PYTHON = ("python3", "-I", "-S", "-c")
BARE = frozenset({"engine_read", "gpu_return"})
HTTP_PART = "# ---- the run's deadline and HTTP"


def _text(name: str) -> str:
    return resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """The text of the program `name` (a file of this package, e.g. "weights_check"), the prelude
    before it unless it is BARE; the prelude's deadline and HTTP part only when it calls
    http_request or deadline (a third of the prelude's compile, on every no-op's models_on_disk)."""
    text = _text(name)
    if name in BARE:
        return text
    prelude = _text("_prelude")
    if "http_request(" not in text and "deadline(" not in text:
        prelude = prelude[:prelude.index(HTTP_PART)] + "# ---- the program\n"
    if text.startswith("#!"):
        shebang, text = text.split("\n", 1)
        return f"{shebang}\n{prelude}{text}"
    return prelude + text


def argv(name: str, *args) -> list[str]:
    """The argument list that runs the program `name` on a host with `args` (each one word)."""
    return [*PYTHON, source(name), *(str(a) for a in args)]
