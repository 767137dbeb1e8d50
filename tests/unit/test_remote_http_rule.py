"""One HTTP rule for every host program that speaks HTTP (the prelude's http_request: smoke,
metrics, hub; the health program's curl options), against servers on 127.0.0.1: an instance that
redirects to a second server on another port gets its own answer reported (the second server hears
nothing, so never the API key), a redirect to file:// or ftp:// is never followed, and a server
trickling one byte a second keeps no program past its whole-run deadline (the only test here
that measures time: it ends within the deadline + 3 s). The controller's bounds around each
program stay above its own deadline."""
import json
import shlex
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nemofleet import canary, remote, shell
from test_remote_hub import REPO, commit, hub, mirrors, token_file  # noqa: F401 - fixtures
from test_remote_host_files import smoke_on_host

KEY = "sk-rule-0123456789"
HEADER = f"Authorization: Bearer {KEY}\n"


class Recorder:
    """A server that answers `routes[path]` = (status, headers, body) for GET and POST and records
    (method, path, Authorization) of every request."""

    def __init__(self):
        self.routes, self.seen = {}, []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def answer(self):
                if self.command == "POST":
                    self.rfile.read(int(self.headers.get("content-length") or 0))
                outer.seen.append((self.command, self.path, self.headers.get("authorization")))
                status, headers, body = outer.routes.get(self.path, (404, {}, b"{}"))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    made = []

    def make():
        made.append(Recorder())
        return made[-1]
    yield make
    for s in made:
        s.close()


class Trickle:
    """A server that, once a request came, sends one byte a second until the client goes: of its
    status line and headers ("head"), or of a 1 MB body after its headers ("body")."""

    def __init__(self, where):
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.where = where
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        with conn:
            conn.recv(65536)
            head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n"
            if self.where == "body":
                conn.sendall(head)
            trickle = b"HTTP/1.1 200 OK\r\nX-Slow: " if self.where == "head" else b""
            i = 0
            while not self.stop.wait(1):
                try:
                    conn.sendall(trickle[i:i + 1] or b"a")
                except OSError:
                    return
                i += 1

    def close(self):
        self.stop.set()
        self.listener.close()


@pytest.fixture(params=["head", "body"])
def trickle(request):
    t = Trickle(request.param)
    yield t
    t.close()


def config(*ports):
    return json.dumps({"address": "127.0.0.1", "instances": [
        {"name": f"n{i}", "port": p, "model": "m", "unit": "u"} for i, p in enumerate(ports)]})


def metrics(tmp_path, cfg, timeout=5, deadline=10):
    """remote/metrics.py as the rollout runs it (its shell line), with its files in tmp_path."""
    (tmp_path / "health.json").write_text(cfg)
    (tmp_path / "auth").write_text(HEADER)
    line = shell.join(remote.argv("metrics", tmp_path / "health.json", tmp_path / "auth", timeout, deadline))
    t0 = time.monotonic()
    r = subprocess.run(["sh", "-c", line.replace("python3 ", shlex.quote(sys.executable) + " ", 1)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return canary.split_instances(r.stdout.splitlines())[1], time.monotonic() - t0


# ---------------------------------------------------------------------------- redirects

def test_smoke_reports_the_instances_own_redirect_and_sends_the_key_nowhere_else(tmp_path, servers):
    a, b = servers(), servers()
    a.routes["/v1/chat/completions"] = (307, {"Location": b.url + "/v1/chat/completions"}, b"moved")
    b.routes["/v1/chat/completions"] = (200, {}, json.dumps({"choices": [{"message": {"content": "not me"}}]}).encode())
    answer, _ = smoke_on_host(tmp_path, {"api-auth.header": HEADER, "health.json": config(a.port)})
    assert not answer.ok and answer.error == f"HTTP 307 from instance 127.0.0.1:{a.port}: moved"
    assert a.seen == [("POST", "/v1/chat/completions", f"Bearer {KEY}")] and b.seen == []


def test_metrics_reports_no_redirected_answer_as_the_instances(tmp_path, servers):
    a, b = servers(), servers()
    a.routes["/metrics"] = (302, {"Location": b.url + "/metrics"}, b"")
    b.routes["/metrics"] = (200, {}, b'vllm:request_success_total{model_name="m"} 99.0\n')
    texts, _ = metrics(tmp_path, config(a.port))
    assert texts == {"n0": ""} and a.seen == [("GET", "/metrics", f"Bearer {KEY}")] and b.seen == []


@pytest.mark.parametrize("location", ["file:///etc/hostname", "ftp://127.0.0.1/x"])
def test_a_redirect_to_another_scheme_is_never_followed(tmp_path, servers, location, mirrors, token_file):
    a = servers()
    a.routes["/metrics"] = (302, {"Location": location}, b"")
    a.routes["/v1/chat/completions"] = (302, {"Location": location}, b"")
    assert metrics(tmp_path, config(a.port))[0] == {"n0": ""}
    answer, _ = smoke_on_host(tmp_path, {"api-auth.header": HEADER, "health.json": config(a.port)})
    assert answer.error.startswith(f"HTTP 302 from instance 127.0.0.1:{a.port}")
    m = mirrors()  # the Hub follows redirects (its CDN): never to another scheme
    m.routes[f"/api/models/{REPO}/revision/main"] = (302, {"Location": location}, b"")
    assert "(HTTP 302)" in commit(m.url, token_file)["error"] and len(m.seen) == 1


def test_health_follows_no_redirect_with_the_key(tmp_path, servers):
    """The health program's curl: no -L, so a redirect is the instance's answer and the key stays."""
    from test_remote_health import run as health_run, setup as health_setup

    a, b = servers(), servers()
    a.routes["/health"] = (200, {}, b"{}")
    a.routes["/v1/models"] = (302, {"Location": b.url + "/v1/models"}, b"")
    b.routes["/v1/models"] = (200, {}, json.dumps({"data": [{"id": "m"}]}).encode())
    plan = health_setup(tmp_path, address="127.0.0.1", auth_header=str(tmp_path / "api-auth.header"),
                        instances=[{"name": "n0", "port": a.port, "model": "m", "unit": "u.service"}])
    (tmp_path / "api-auth.header").write_text(HEADER)
    (tmp_path / "bin" / "curl").unlink()  # the real one
    r = health_run(tmp_path, plan, PATH=f"{tmp_path}/bin:/usr/bin:/bin")
    assert r.returncode == 1 and "UNHEALTHY: /v1/models does not list m" in r.stdout, r.stdout + r.stderr
    assert ("GET", "/v1/models", f"Bearer {KEY}") in a.seen and b.seen == []


# ---------------------------------------------------------------------------- deadlines

def test_smoke_ends_by_its_deadline_against_a_trickle(tmp_path, trickle):
    answer, took = smoke_on_host(tmp_path, {"api-auth.header": HEADER, "health.json": config(trickle.port)},
                                 deadline=2)
    assert not answer.ok and answer.error == f"no HTTP answer from instance 127.0.0.1:{trickle.port}: the deadline passed"
    assert took < 2 + 3


def test_metrics_ends_by_its_deadline_and_each_instance_by_its_timeout(tmp_path, trickle):
    texts, took = metrics(tmp_path, config(trickle.port, trickle.port), timeout=5, deadline=2)
    assert texts == {"n0": "", "n1": ""} and took < 2 + 3  # the run's deadline: n1 is not asked
    texts, took = metrics(tmp_path, config(trickle.port, trickle.port), timeout=1, deadline=30)
    assert texts == {"n0": "", "n1": ""} and took < 2 * 1 + 3  # each instance's own bound


def test_hub_ends_by_its_deadline(tmp_path, trickle, token_file):
    t0 = time.monotonic()
    r = hub("commit", trickle.url, REPO, "main", token_file, deadline=2)
    assert json.loads(r.stdout) == {"error": f"{trickle.url} is unreachable from the host (the deadline passed)"}
    r = hub("precheck", tmp_path, REPO, "main", trickle.url, token_file, 0, deadline=2)
    assert r.returncode == 1 and "is unreachable (the deadline passed)" in r.stderr
    assert time.monotonic() - t0 < 2 * (2 + 3)


def test_the_controllers_bounds_stay_above_each_programs_deadline():
    """Every invocation of a program that waits on a server: its own deadline (its last argument)
    below the bound the controller puts around it."""
    from nemofleet.facts import engine
    from nemofleet.facts.weights import HUB_COMMIT_TIMEOUT, HubCommit
    from nemofleet.fleet import rollout, smoke
    from nemofleet.operations.weights import precheck_command

    def last_arg(cmd, program):
        w = shlex.split(cmd)
        assert remote.source(program) in w
        return w, float(w[-1])

    w, d = last_arg(HubCommit().command("https://huggingface.co", REPO, "main").rsplit(" 2>/dev/null || ", 1)[0], "hub")
    assert w[:2] == ["timeout", str(HUB_COMMIT_TIMEOUT)] and d < HUB_COMMIT_TIMEOUT
    w, d = last_arg(precheck_command("/srv/m/x", REPO, "main", None, "/etc/x", 0), "hub")
    assert w[0] == "timeout" and d < float(w[1])
    w, d = last_arg(rollout.METRICS_SCRIPT, "metrics")
    assert d < rollout.METRICS_TIMEOUT and float(w[-2]) < d  # an instance's timeout within the run's
    w, d = last_arg(smoke.script("hi").split(f" <<'{smoke.BODY_END}'")[0], "smoke")
    assert d == smoke.CURL_MAX_TIME  # exec_all's timeout is CURL_MAX_TIME + 60 (fleet/smoke.run)
    assert engine.ENGINE_TIMEOUT < engine.PROCESS_TIMEOUT


def test_engine_read_ends_by_its_deadline_against_a_trickling_socket(tmp_path):
    """engine_read (bare: dockerd's unix socket) under the same kind of trickle: each recv waits only
    for what is left of its deadline, so the read is `timeout` at 2 s, not one wait of 2 s per byte."""
    stop = threading.Event()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "docker.sock"))
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
            while not stop.wait(1):
                try:
                    conn.sendall(b"{")
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True).start()
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, *remote.argv("engine_read", 2, "info", "/info")[1:]], capture_output=True,
                           text=True, env={"DOCKER_HOST": f"unix://{tmp_path}/docker.sock"}, timeout=30)
    finally:
        stop.set()
        listener.close()
    assert r.stdout == "@@engine timeout info\n" and time.monotonic() - t0 < 2 + 3
