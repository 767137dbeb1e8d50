"""`nemofleet smoke`: one chat completion per host, asked on the host itself over SSH.

The request goes where a client on the host would send it: the front door when the host has one
(its HAProxy `front_door` frontend, bound on 127.0.0.1), else the first instance with an API, at
the address and port the deployed health script checks (/usr/local/bin/nemofleet-health lists
each instance's port and served name). So it tests what is deployed, not what the inventory plans.

The API key never leaves the host and never reaches a command line: curl reads the whole
`Authorization` header from the host's 0600 file (`-H @/etc/nemofleet/api-auth.header`, written by
the deploy). The request body is JSON built here (json.dumps: the prompt is quoted, whatever it
holds) and reaches curl on its stdin through a quoted here-document, so no shell expands it.
curl's own figures give the latency, without the SSH round trip.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from .. import paths

DEFAULT_PROMPT = "What is 17*23? Answer in one sentence."
DEFAULT_MAX_TOKENS = 512
CURL_MAX_TIME = 120  # seconds for the one completion; the SSH step gets a minute more
MARK = "@@nemofleet-smoke"
BODY_END = "NEMOFLEET_SMOKE_BODY_END"  # json.dumps never writes a newline, so never this line
WORDS = 12  # how much of the answer is shown


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

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def body_tail(prompt: str, max_tokens: int = DEFAULT_MAX_TOKENS) -> str:
    """The request body without its opening brace and model (the host adds `{"model": NAME, `,
    the served name it reads from its own health script). One line of JSON, ASCII only."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens},
                      ensure_ascii=True)
    assert body.startswith("{") and "\n" not in body
    return body[1:]


def script(prompt: str, max_tokens: int = DEFAULT_MAX_TOKENS) -> str:
    """The POSIX shell program run on each host. It prints the answer's body, then one marker
    line `MARK http CODE SECONDS VIA`, or `MARK error SENTENCE`, or `MARK skip SENTENCE`."""
    q = shlex.quote
    return f"""set -u
AUTH={q(paths.API_AUTH)}
HEALTH={q(paths.HEALTH_SCRIPT)}
CFG={q(paths.FRONT_DOOR_CFG)}
say() {{ printf '%s %s\\n' {q(MARK)} "$*"; }}
[ -r "$AUTH" ] || {{ say "error it has no API key file $AUTH: deploy it first"; exit 0; }}
[ -r "$HEALTH" ] || {{ say "error it has no $HEALTH: deploy it first"; exit 0; }}
# the first instance with an API (a headless worker's port is 0): port and served name
first=$(sed -n '/^INSTANCES=(/,/^)/p' "$HEALTH" | tr -d "'" | awk 'NF == 4 && $2 != "0" {{print $2, $3; exit}}')
if [ -z "$first" ]; then
  if grep -q '^GROUP=.* GROUP_ROLE=worker ' "$HEALTH"; then say "skip a worker of a serving group: its head answers"; exit 0; fi
  say "error its health script lists no instance with an API"; exit 0
fi
port=${{first%% *}}
model=${{first#* }}
case "$model" in ''|*[!A-Za-z0-9._/:+-]*) say "error its served model name is not an API model name"; exit 0 ;; esac
address=$(sed -n 's/^ADDRESS=\\([^ ]*\\).*/\\1/p' "$HEALTH" | tr -d "'")
via="instance $address:$port"
url="http://$address:$port/v1/chat/completions"
if [ -r "$CFG" ] && grep -q '^frontend front_door$' "$CFG"; then
  fd=$(sed -n 's/^ *bind 127\\.0\\.0\\.1:\\([0-9][0-9]*\\)$/\\1/p' "$CFG" | head -n 1)
  [ -n "$fd" ] && {{ via="front door 127.0.0.1:$fd"; url="http://127.0.0.1:$fd/v1/chat/completions"; }}
fi
out=$({{ printf '{{"model": "%s", ' "$model"; cat <<'{BODY_END}'
{body_tail(prompt, max_tokens)}
{BODY_END}
}} | curl -sS --max-time {CURL_MAX_TIME} -H @"$AUTH" -H 'Content-Type: application/json' --data-binary @- \\
    -w '\\n{MARK} http %{{http_code}} %{{time_total}}' "$url" 2>&1)
printf '%s %s\\n' "$out" "$via"
"""


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
    m = re.fullmatch(r"(\d{3}) ([0-9.]+) (.*)", rest)
    if kind != "http" or not m:
        return Answer(host, False, error=f"unexpected marker line {lines[i][:200]!r}")
    code, seconds, via = int(m.group(1)), float(m.group(2)), m.group(3)
    if code == 0:  # curl did not get an answer: its own message is the body
        return Answer(host, False, via=via, error=f"no HTTP answer from {via}: {' '.join(body.split())[:200]}")
    try:
        doc = json.loads(body)
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
               prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else None,
               completion_tokens=completion_tokens if isinstance(completion_tokens, int) else None)
    if not isinstance(content, str) or not content.strip():
        finish = choice.get("finish_reason") if isinstance(choice, dict) else None
        a.ok = False
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
