"""Docker facts read from the Docker Engine API, one python for every read of a remote command.

Each `docker` CLI call on a converged host cost about 35 ms of its CPU (the Go client's start
and dockerd's answer), and a no-op made four: `docker info`, `docker image inspect`, `docker
network inspect` and `docker inspect`. One `python3 -I -S` asking dockerd over its unix socket for
all of them costs about a third of that (docs/measurements.md). The resources are the ones the
CLI itself asks for (GET /info, /images/{ref}/json, /networks/{name}, /containers/{name}/json),
so the answers are the same.

An `EngineFact` names its requests (a key and an API path) and reads its value out of the lines
the read prints, one per request: `@@engine STATUS KEY BODY` (the HTTP status and dockerd's JSON,
or "down" when no engine answers at the socket -- not installed, not running, or DOCKER_HOST is
not a unix socket -- or "timeout"). A combined command (HostFacts, prefetch.Batch) reads every
EngineFact of it at once (`shared`) and hands each part the read's lines (`lines_for`): each
part takes its own keys.

python3 is already needed on a host for the weights checks (facts/weights.py); without it every
engine fact says so in one sentence.
"""

from __future__ import annotations

from typing import Any

from urllib.parse import quote as url_quote, unquote as url_unquote

from .. import remote, shell
from . import Fact
from ..nvsmi import TIMED_OUT, Unreadable
from ..valuetypes import host_json, host_number

MARK = "@@engine "
# dockerd answers each of these in milliseconds; 20 s for all of a read means dockerd is hung (a
# stuck storage driver, a full disk): that host is refused, the run goes on for the others.
ENGINE_TIMEOUT = 20
# python3 itself is bounded too (a process stuck before its first request): a little over the above
PROCESS_TIMEOUT = ENGINE_TIMEOUT + 5
NO_PYTHON = ("python3 is not installed on the host: nemofleet reads the Docker engine and checks the "
             "weights with it (apt-get install python3-minimal)")

# The read itself is the program remote/engine_read.py (its argv: the deadline in seconds, then a
# (key, API path) pair per request; one `@@engine STATUS KEY BODY` line per request).


def request(key: str, path: str) -> tuple[str, str]:
    """One GET. `key` names the answer (no whitespace: it is a word of the answer's line);
    `path` is built from API words and names %-quoted by `named` (a name with a space or a CR
    cannot change the request line)."""
    if not key or any(c.isspace() or not c.isprintable() for c in key):
        raise ValueError(f"an engine request key must be one printable word: {key!r}")
    return key, path


def _quoted(name: str) -> str:
    # as the docker CLI sends a name in a path: `/`, `:` and `@` of an image reference kept,
    # anything else of note (space, CR, LF, `%`, `?`, `#`, quotes) %-quoted
    return url_quote(str(name), safe="/:@")


def named(prefix: str, name: str, suffix: str = "") -> str:
    """/prefix/{name}{suffix}, the name %-quoted."""
    return f"/{prefix}/{_quoted(name)}{suffix}"


def key(kind: str, name: str) -> str:
    """The key of the answer about `name`: one word whatever the name holds (%-quoted)."""
    return f"{kind}:{_quoted(name)}"


def keyed(output, kind: str) -> list[tuple[str, Any, Any]]:
    """[(name, status, body)] of a read's answers of one kind (`answers`), the names as the fact
    was asked for them."""
    return [(url_unquote(k[len(kind) + 1:]), *v) for k, v in answers(output).items() if k.startswith(f"{kind}:")]


def read_command(requests) -> str:
    """The shell command that reads `requests` and prints a line per request (or, when python3 is
    missing or the read itself was stopped, one `@@engine error WHY` line)."""
    seen, argv = set(), ["timeout", PROCESS_TIMEOUT, *remote.argv("engine_read", ENGINE_TIMEOUT)]
    for key, path in requests:
        if key not in seen:
            seen.add(key)
            argv += [key, path]
    return (f"if command -v python3 >/dev/null 2>&1; then {shell.join(argv)} 2>/dev/null; rc=$?; "
            f"if [ $rc -eq {TIMED_OUT} ]; then echo '{MARK}error timeout'; "
            f"elif [ $rc -ne 0 ]; then echo '{MARK}error failed'; fi; "
            f"else echo '{MARK}error python3'; fi")


def answers(output) -> dict:
    """{key: (status, body)} from a read's lines (other lines are ignored); status is an int for
    an HTTP status, else "down", "timeout" or "garbled"; body is the parsed JSON of an HTTP
    answer (None when it is not JSON), or the reason's text. Unreadable when the read itself
    failed or printed nothing."""
    found: dict = {}
    saw = False
    for line in output:
        if not line.startswith(MARK):
            continue
        saw = True
        status, _, rest = line[len(MARK):].partition(" ")
        key, _, body = rest.partition(" ")
        if status == "error":
            if key == "python3":
                raise Unreadable(NO_PYTHON)
            if key == "timeout":
                raise Unreadable(f"the Docker engine did not answer within {ENGINE_TIMEOUT} s (dockerd hung?): "
                                 "check `systemctl status docker` on the host")
            raise Unreadable("the Docker engine read failed on the host (python3 exited with an error)")
        code = host_number(status, 100, 599)
        if code is not None:
            try:
                found[key] = (code, host_json(body))
            except ValueError:
                found[key] = (code, None)
        else:
            found[key] = (status, body.strip() or None)
    if not saw:
        raise Unreadable("the Docker engine read printed nothing")
    return found


class EngineFact(Fact):
    """A fact read from the Engine API: `requests(**kwargs)` names what it asks for and `parse(lines)`
    takes its keys from `answers(lines)`; `prefix(**kwargs)` is a shell command whose lines come
    before the read's (DockerInfo: is the docker CLI installed). A read that failed gives the
    fact's own fallback (Unreadable.value) or its default; HostFacts refuses the host in its sentence."""

    def requests(self, *args: Any, **kwargs: Any) -> list[tuple[str, str]]:
        raise NotImplementedError

    def prefix(self, *args: Any, **kwargs: Any) -> str | None:
        return None

    def read(self, **kwargs) -> str:
        """The fact's command on its own (each subclass's `command` names its arguments, as pyinfra
        and the operation tests read them from its signature)."""
        pre = self.prefix(**kwargs)
        read = read_command(self.requests(**kwargs))
        return f"{pre}; {read}" if pre else read


def shared(parts) -> tuple[str | None, list[str]]:
    """For a combined command of parts [(fact, kwargs)]: (the one read of every EngineFact's
    requests, or None when there is none; per part its command in the combined one: an
    EngineFact's prefix, or "true", and any other fact's own command). The combined fact's parser
    hands the read's lines to each EngineFact (`lines_for`)."""
    requests, commands = [], []
    for fact, kwargs in parts:
        if isinstance(fact, EngineFact):
            requests += fact.requests(**kwargs)
            commands.append(fact.prefix(**kwargs) or "true")
        else:
            commands.append(fact.command(**kwargs) if callable(fact.command) else fact.command)
    return (read_command(requests) if requests else None), commands


def lines_for(fact, own: list[str], read: list[str]) -> list[str]:
    """A part's lines in a combined fact: its own, and the shared read's when it is an EngineFact."""
    return own + read if isinstance(fact, EngineFact) and read else own
