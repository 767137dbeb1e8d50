"""`nemofleet smoke`: one chat completion per host, asked on the host itself over SSH.

The request goes where a client on the host would send it: the front door when the host has one
(its HAProxy `front_door` frontend, bound on 127.0.0.1), else the first instance with an API, at
the address and port the deployed health program checks (/etc/nemofleet/health.json lists each
instance's port and served name). So it tests what is deployed, not what the inventory plans.

The asking is the program remote/smoke.py (standard library only), run on the host with its paths
as arguments. The API key never leaves the host and never reaches a command line: the program reads
the whole `Authorization` header from the host's 0600 file (/etc/nemofleet/api-auth.header, written
by the deploy). The request body is JSON built here (json.dumps: the prompt is quoted, whatever it
holds) and reaches the program on its stdin through a quoted here-document, so no shell expands it.
The latency is the program's own, without the SSH round trip.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .. import paths, remote, shell
from ..valuetypes import host_json, host_number, is_int, reads_host, shown

DEFAULT_PROMPT = "What is 17*23? Answer in one sentence."
DEFAULT_MAX_TOKENS = 512
CURL_MAX_TIME = 120  # seconds for the whole run of the program (its deadline); the SSH step gets a minute more
MARK = "@@nemofleet-smoke"
BODY_END = "NEMOFLEET_SMOKE_BODY_END"  # json.dumps never writes a newline, so never this line
WORDS = 12  # how much of the answer is shown
# bytes of the request's JSON: it travels inside the SSH command, one argument to the host's shell,
# which Linux caps at 128 KiB (MAX_ARG_STRLEN); the rest is the program (nemofleet smoke --prompt-file)
MAX_BODY = 64 * 1024


@dataclass
class Answer:
    """One host's completion: ok, or the sentence saying why not."""
    host: str
    ok: bool
    via: str = ""  # "front door 127.0.0.1:8800" or "instance 127.0.0.1:8000"
    words: str = ""  # the first words of the answer
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    seconds: float | None = None
    error: str = ""
    skipped: bool = False  # a headless worker of a serving group: its head answers for it


def body(prompt: str, max_tokens: int = DEFAULT_MAX_TOKENS) -> str:
    """The request body without the model (the host adds its own served name, read from its health
    config). One line of JSON, ASCII only: it travels as stdin in a quoted here-document."""
    text = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens},
                      ensure_ascii=True)
    assert text.startswith("{") and "\n" not in text
    return text


def script(prompt: str, max_tokens: int = DEFAULT_MAX_TOKENS) -> str:
    """The shell line run on each host: the program remote/smoke.py with its paths as arguments and
    the request as JSON on its stdin (a here-document whose delimiter is quoted, so the shell
    expands nothing in it; json.dumps never writes a newline, so never the delimiter line). It
    prints the answer's body, then one marker line `MARK http CODE SECONDS VIA`, or `MARK error
    SENTENCE`, or `MARK skip SENTENCE`."""
    argv = remote.argv("smoke", MARK, paths.HEALTH_CONFIG, paths.API_AUTH, paths.FRONT_DOOR_CFG, CURL_MAX_TIME)
    return f"{shell.join(argv)} <<'{BODY_END}'\n{body(prompt, max_tokens)}\n{BODY_END}\n"


@reads_host(lambda why, host, *_, **__: Answer(host, False, error=why))
def parse(host: str, rc: int, text: str, reachable: bool = True) -> Answer:
    """The Answer of one host from its output (the script's, through pyinfra)."""
    if not reachable:
        return Answer(host, False, error=f"unreachable: {text.strip()[-200:]}")
    lines = text.splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith(MARK + " ")]
    if not marks:
        tail = " ".join(text.split())[-200:]
        return Answer(host, False, error=f"no answer from the smoke script (exit {rc}): {tail or 'no output'}")
    i = marks[-1]
    kind, _, rest = lines[i][len(MARK) + 1:].partition(" ")
    if kind == "skip":
        return Answer(host, True, skipped=True, error=rest)
    if kind == "error":
        return Answer(host, False, error=rest)
    body = "\n".join(lines[:i]).strip()
    m = re.fullmatch(r"(\S+) (\S+) (.*)", rest)
    code, seconds = (host_number(m.group(1), 0, 999), host_number(m.group(2), 0, 86400, decimal=True)) if m else (None, None)
    if m is None or kind != "http" or code is None or seconds is None:
        return Answer(host, False, error=f"unexpected marker line {shown(lines[i], 200)}")
    via = m.group(3)
    if code == 0:  # no HTTP answer (refused, timed out): the reason is the body
        return Answer(host, False, via=via, error=f"no HTTP answer from {via}: {' '.join(body.split())[:200]}")
    try:
        doc = host_json(body)
    except ValueError:
        doc = None
    if code != 200:
        why = doc.get("error") if isinstance(doc, dict) else None
        why = why.get("message") if isinstance(why, dict) else why if isinstance(why, str) else None
        if why is None and isinstance(doc, dict) and isinstance(doc.get("detail"), str):
            why = doc["detail"]
        return Answer(host, False, via=via, seconds=seconds,
                      error=f"HTTP {code} from {via}: {' '.join(str(why or body).split())[:200]}")
    try:
        choice = doc["choices"][0]
        message = choice["message"]
        usage = doc.get("usage") or {}
    except (TypeError, KeyError, IndexError):
        return Answer(host, False, via=via, seconds=seconds,
                      error=f"HTTP 200 from {via} but not a chat completion: {' '.join(body.split())[:200]}")
    content = message.get("content") if isinstance(message, dict) else None
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    completion_tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    a = Answer(host, True, via=via, seconds=seconds,
               prompt_tokens=prompt_tokens if is_int(prompt_tokens) else None,
               completion_tokens=completion_tokens if is_int(completion_tokens) else None)
    if not isinstance(content, str) or not content.strip():
        finish = choice.get("finish_reason") if isinstance(choice, dict) else None
        a.ok = False
        finish = finish if isinstance(finish, str) and finish.isprintable() and len(finish) < 40 else shown(finish)
        a.error = (f"the answer from {via} has no content (finish_reason {finish}): "
                   + ("the reasoning used every token; raise --max-tokens" if finish == "length" else "see the server log"))
        return a
    words = content.split()
    a.words = " ".join(words[:WORDS]) + (" ..." if len(words) > WORDS else "")
    return a


def smoke(inventory: str, limit: list[str] | None, prompt: str = DEFAULT_PROMPT,
          max_tokens: int = DEFAULT_MAX_TOKENS) -> list[Answer]:
    """One completion per selected serving host (fleet gateways left out), all hosts at once."""
    from . import driver

    hosts = driver.serving_hosts(inventory, limit)
    answers = driver.exec_all(inventory, hosts, script(prompt, max_tokens), timeout=CURL_MAX_TIME + 60)
    return [parse(h, e.rc, e.text, e.reachable) for h, e in answers.items()]


def table(answers: list[Answer]) -> list[str]:
    """A line per host: status, latency, tokens, where it went and the first words (or why not)."""
    width = max([len(a.host) for a in answers] + [4])
    out = []
    for a in answers:
        if a.skipped:
            out.append(f"{a.host:<{width}}  skip  {a.error}")
        elif not a.ok:
            out.append(f"{a.host:<{width}}  FAIL  {a.error}")
        else:
            tokens = f"{a.completion_tokens} tokens" if a.completion_tokens is not None else "? tokens"
            out.append(f"{a.host:<{width}}  ok    {a.seconds:5.2f} s  {tokens:>11}  {a.via}: \"{a.words}\"")
    return out
