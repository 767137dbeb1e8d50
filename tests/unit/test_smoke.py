"""`nemofleet smoke` (nemofleet.fleet.smoke): the program it runs on each host (remote/smoke.py,
through the shell line it builds), run here with sh against a local HTTP server that checks the key as vLLM does, with the host's files in a temporary
directory; the command line it builds (no key on any argv, the prompt JSON-quoted on stdin); and
the parsing of every kind of answer."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nemofleet import paths
from nemofleet.fleet import smoke

KEY = "sk-smoke-test-0123456789"
HOSTILE = 'quote " backslash \\ dollar $(touch /tmp/pwned) `id` \'single\'\nnewline NEMOFLEET_SMOKE_BODY_END é'


class Server:
    """An OpenAI-compatible stub: 401 without the key, 404 for another model, else a completion."""

    def __init__(self):
        self.bodies: list[dict] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                data = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("authorization") != f"Bearer {KEY}":
                    return self.send(401, {"error": "Unauthorized"})
                body = json.loads(data)
                outer.bodies.append(body)
                if body.get("model") != "nemotron-3.5-lightning":
                    return self.send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                return self.send(200, {"choices": [{"message": {"content": "391. The product is (17 x 20) + "
                                                                "(17 x 3) = 391, and more words after that."},
                                                    "finish_reason": "stop"}],
                                       "usage": {"prompt_tokens": 12, "completion_tokens": 68}})

            def send(self, code, doc):
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def health_config(port: int, model: str = "nemotron-3.5-lightning", worker: bool = False) -> str:
    """The parts of a deployed /etc/nemofleet/health.json the smoke reads (render.health_config)."""
    p = 0 if worker else port
    return json.dumps({"address": "127.0.0.1", "instances": [
        {"name": "nemotron-0", "port": p, "model": model, "unit": "nemofleet-vllm-nemotron-0.service"},
        {"name": "nemotron-1", "port": p, "model": model, "unit": "nemofleet-vllm-nemotron-1.service"}],
        "group": {"name": "mn", "role": "worker", "rank": 1, "head": "10.0.0.1", "port": 29500} if worker else None})


def host_script(tmp: Path, text: str) -> str:
    """The smoke program with the host's paths moved under `tmp`."""
    for p in (paths.API_AUTH, paths.HEALTH_CONFIG, paths.FRONT_DOOR_CFG):
        assert p in text
        text = text.replace(p, str(tmp / Path(p).name))
    return text


def run_on_host(tmp: Path, prompt: str, port: int, *, key: str | None = KEY, front_door: int | None = None,
                model: str = "nemotron-3.5-lightning", worker: bool = False):
    if key is not None:
        (tmp / "api-auth.header").write_text(f"Authorization: Bearer {key}\n")
        (tmp / "api-auth.header").chmod(0o600)
    (tmp / "health.json").write_text(health_config(port, model, worker))
    if front_door:
        (tmp / "haproxy.cfg").write_text(f"global\n\nfrontend front_door\n    bind 127.0.0.1:{front_door}\n"
                                         "    bind 172.17.0.1:8800\n    default_backend vllm\n")
    r = subprocess.run(["sh", "-c", host_script(tmp, smoke.script(prompt))], capture_output=True, text=True,
                       env=dict(os.environ), timeout=60)
    return r, smoke.parse("h1", r.returncode, r.stdout + r.stderr)


def test_a_completion_through_the_instance(tmp_path, server):
    r, a = run_on_host(tmp_path, "What is 17*23?", server.port)
    assert a.ok, (a, r.stdout, r.stderr)
    assert a.via == f"instance 127.0.0.1:{server.port}"
    assert a.words == "391. The product is (17 x 20) + (17 x 3) = ..."  # 12 words
    assert (a.prompt_tokens, a.completion_tokens) == (12, 68)
    assert 0 <= a.seconds < 10
    assert server.bodies == [{"model": "nemotron-3.5-lightning", "max_tokens": smoke.DEFAULT_MAX_TOKENS,
                              "messages": [{"role": "user", "content": "What is 17*23?"}]}]
    line, = smoke.table([a])
    assert line.startswith("h1    ok ") and "68 tokens" in line and '"391. The product' in line


def test_a_hostile_prompt_arrives_as_it_was_typed(tmp_path, server):
    r, a = run_on_host(tmp_path, HOSTILE, server.port)
    assert a.ok, (a, r.stdout, r.stderr)
    assert server.bodies[0]["messages"][0]["content"] == HOSTILE
    assert not Path("/tmp/pwned").exists()


def test_through_the_front_door_when_the_host_has_one(tmp_path, server):
    r, a = run_on_host(tmp_path, "hi", port=1, front_door=server.port)  # the instance port is not used
    assert a.ok, (a, r.stdout, r.stderr)
    assert a.via == f"front door 127.0.0.1:{server.port}"


def test_a_wrong_key_is_one_sentence(tmp_path, server):
    r, a = run_on_host(tmp_path, "hi", server.port, key="sk-wrong")
    assert not a.ok
    assert a.error == f"HTTP 401 from instance 127.0.0.1:{server.port}: Unauthorized"


def test_nothing_listening_is_one_sentence(tmp_path, server):
    port = server.port
    server.close()
    server.httpd.server_close()
    r, a = run_on_host(tmp_path, "hi", port)
    assert not a.ok
    assert a.error == f"no HTTP answer from instance 127.0.0.1:{port}: [Errno 111] Connection refused"


def test_not_deployed_worker_and_bad_model_name(tmp_path):
    r, a = run_on_host(tmp_path, "hi", 8000, key=None)
    assert not a.ok and a.error.startswith("it has no API key file ") and a.error.endswith(": deploy it first")
    r, a = run_on_host(tmp_path, "hi", 8000, worker=True)
    assert a.ok and a.skipped and a.error == "a worker of a serving group: its head answers"
    r, a = run_on_host(tmp_path, "hi", 8000, model='x"},"evil":{"')
    assert not a.ok and a.error == "its served model name is not an API model name"


def test_the_key_is_on_no_command_line_and_the_prompt_comes_on_stdin(tmp_path, server):
    """The key is read on the host from the 0600 header file; the command line (what `ps` shows on
    the controller and the host) holds the program and its paths, the prompt only as JSON on stdin."""
    r, a = run_on_host(tmp_path, HOSTILE, server.port)
    assert a.ok, (a, r.stdout, r.stderr)
    text = smoke.script(HOSTILE)
    assert KEY not in text and "Bearer sk" not in text
    # quoted delimiter: the shell expands nothing in the here-document
    command, heredoc = text.split(f" <<'{smoke.BODY_END}'\n", 1)
    argv = shlex.split(command)
    assert argv[:4] == ["python3", "-I", "-S", "-c"] and argv[5:] == [
        smoke.MARK, paths.HEALTH_CONFIG, paths.API_AUTH, paths.FRONT_DOOR_CFG, str(smoke.CURL_MAX_TIME)]
    assert not any("17*23" in w or "pwned" in w for w in argv[5:])
    assert heredoc == f"{smoke.body(HOSTILE)}\n{smoke.BODY_END}\n"
    assert json.loads(smoke.body(HOSTILE))["messages"][0]["content"] == HOSTILE and HOSTILE not in text


def test_parse_every_kind_of_answer():
    p = smoke.parse
    assert p("h", 255, "Could not connect (timeout)", reachable=False).error == "unreachable: Could not connect (timeout)"
    assert p("h", 127, "sh: 1: python3: not found").error == \
        "no answer from the smoke script (exit 127): sh: 1: python3: not found"
    m = smoke.MARK
    ok = p("h", 0, '{"choices": [{"message": {"content": "one two"}, "finish_reason": "stop"}], '
                   f'"usage": {{"completion_tokens": 2}}}}\n{m} http 200 0.25 instance 127.0.0.1:8000')
    assert ok.ok and ok.words == "one two" and ok.completion_tokens == 2 and ok.seconds == 0.25
    starved = p("h", 0, '{"choices": [{"message": {"content": null, "reasoning": "hmm"}, "finish_reason": "length"}]}'
                        f'\n{m} http 200 1.5 front door 127.0.0.1:8800')
    assert not starved.ok and starved.error == ("the answer from front door 127.0.0.1:8800 has no content "
                                                "(finish_reason length): the reasoning used every token; raise --max-tokens")
    err = p("h", 0, f'{{"error": {{"message": "EngineCore died"}}}}\n{m} http 500 0.1 instance 127.0.0.1:8000')
    assert err.error == "HTTP 500 from instance 127.0.0.1:8000: EngineCore died"
    html = p("h", 0, f"<html>bad gateway</html>\n{m} http 502 0.1 front door 127.0.0.1:8800")
    assert html.error == "HTTP 502 from front door 127.0.0.1:8800: <html>bad gateway</html>"
    odd = p("h", 0, f'{{"object": "list"}}\n{m} http 200 0.1 instance 127.0.0.1:8000')
    assert odd.error.startswith("HTTP 200 from instance 127.0.0.1:8000 but not a chat completion")
    assert p("h", 0, f"{m} http nope").error.startswith("unexpected marker line")
    # a marker whose figures are no numbers (float('1.2.3') raised), a body of
    # JSON nested past any parser, or NaN
    for line in (f"{m} http 200 1.2.3 instance x", f"{m} http ٢٠٠ 0.1 instance x", f"{m} http 200 1e309 instance x"):
        assert p("h", 0, line).error.startswith("unexpected marker line"), line
    assert not p("h", 0, "[" * 100000 + f"\n{m} http 200 0.1 instance x").ok
    assert p("h", 0, f'{{"choices": NaN}}\n{m} http 200 0.1 instance x').error.startswith("HTTP 200 from instance x but not")


def test_through_pyinfras_exec_as_the_command_sends_it(tmp_path, server):
    """The same path as `nemofleet smoke` (driver.exec_all: `pyinfra INVENTORY exec -- sh -c ...`),
    with pyinfra's @local connector instead of SSH: the here-document and marker survive it."""
    from nemofleet.fleet import driver

    (tmp_path / "api-auth.header").write_text(f"Authorization: Bearer {KEY}\n")
    (tmp_path / "health.json").write_text(health_config(server.port))
    e = driver.exec_all("@local", ["@local"], host_script(tmp_path, smoke.script(HOSTILE)), timeout=60)["@local"]
    a = smoke.parse("@local", e.rc, e.text, e.reachable)
    assert a.ok, (a, e.text)
    assert server.bodies[0]["messages"][0]["content"] == HOSTILE
