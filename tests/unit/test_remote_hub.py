"""remote/hub.py (the Hub commit query and the download precheck) run as the hosts run it, against
local mirrors on 127.0.0.1 that record every request: the token goes only to the origin it was
meant for (a redirect to another scheme, host or port drops it), and hostile answers (not JSON,
not UTF-8, values of the wrong type, numbers of any size, redirect loops, a redirect to file://)
end in one sentence: never a traceback, never the token."""
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nemofleet import remote

TOKEN = "hf_s3cr3tTOKENvalue"
SHA = "0123456789abcdef0123456789abcdef01234567"
REPO = "org/model"


class Mirror:
    """An HTTP server that answers `routes[path]` = (status, headers, body) and records
    (path, headers) of every request; an unknown path is a 404."""

    def __init__(self):
        self.routes, self.seen = {}, []
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                mirror.seen.append((self.path, dict(self.headers)))
                status, headers, body = mirror.routes.get(self.path, (404, {}, b"{}"))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v.replace("{A}", mirror.url) if isinstance(v, str) else v)
                body = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def auth(self):
        """The Authorization header of each request, in order (None where it had none)."""
        return [next((v for k, v in h.items() if k.lower() == "authorization"), None) for _, h in self.seen]


@pytest.fixture
def mirrors():
    made = []

    def make():
        made.append(Mirror())
        return made[-1]
    yield make
    for m in made:
        m.server.shutdown()
        m.server.server_close()


@pytest.fixture
def token_file(tmp_path):
    p = tmp_path / "hf.env"
    p.write_text(f"HF_TOKEN={TOKEN}\n")
    p.chmod(0o600)
    return p


def hub(*args, deadline=20):
    """The program as the host runs it (remote.argv: the prelude, then hub.py), DEADLINE last."""
    r = subprocess.run([sys.executable, *remote.argv("hub", *args, deadline)[1:]], capture_output=True, text=True,
                       timeout=60, env={"PATH": os.environ["PATH"]})
    assert "Traceback" not in r.stderr and TOKEN not in r.stdout + r.stderr, r.stdout + r.stderr
    return r


def commit(endpoint, token_file, rev="main"):
    r = hub("commit", endpoint, REPO, rev, token_file)
    assert r.returncode == 0
    (line,) = r.stdout.strip().splitlines()
    return json.loads(line)


def precheck(d, endpoint, token_file, present=0):
    return hub("precheck", d, REPO, "main", endpoint, token_file, present)


REV_PATH = f"/api/models/{REPO}/revision/main"
TREE_PATH = f"/api/models/{REPO}/tree/{SHA}?recursive=true&expand=false"


def test_commit_with_the_token_on_its_own_origin(mirrors, token_file):
    a = mirrors()
    a.routes[REV_PATH] = (200, {}, {"sha": SHA})
    assert commit(a.url, token_file) == {"sha": SHA}
    assert a.auth() == [f"Bearer {TOKEN}"]


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_port_or_host_drops_the_token(mirrors, token_file, code):
    a, b = mirrors(), mirrors()
    a.routes[REV_PATH] = (code, {"Location": b.url + REV_PATH}, b"")
    b.routes[REV_PATH] = (code, {"Location": "http://localhost:%d/r" % b.server.server_address[1]}, b"")
    b.routes["/r"] = (200, {}, {"sha": SHA})
    assert commit(a.url, token_file) == {"sha": SHA}
    assert a.auth() == [f"Bearer {TOKEN}"]
    assert b.auth() == [None, None]  # another port, then another host name (localhost) of that port
    assert [p for p, _ in b.seen] == [REV_PATH, "/r"]


def test_a_redirect_on_the_same_origin_keeps_it_and_a_return_after_leaving_does_not(mirrors, token_file):
    a, b = mirrors(), mirrors()
    a.routes[REV_PATH] = (307, {"Location": "/moved"}, b"")  # relative: the same origin
    a.routes["/moved"] = (302, {"Location": b.url + "/away"}, b"")
    b.routes["/away"] = (302, {"Location": a.url + "/back"}, b"")
    a.routes["/back"] = (200, {}, {"sha": SHA})
    assert commit(a.url, token_file) == {"sha": SHA}
    assert a.auth() == [f"Bearer {TOKEN}", f"Bearer {TOKEN}", None]
    assert b.auth() == [None]


@pytest.mark.parametrize("location", ["file:///etc/passwd", "ftp://127.0.0.1/x", "gopher://x/"])
def test_a_redirect_to_anything_but_http_is_refused(mirrors, token_file, location):
    a = mirrors()
    a.routes[REV_PATH] = (302, {"Location": location}, b"")
    out = commit(a.url, token_file)
    assert "error" in out and "HTTP 302" in out["error"] and len(a.seen) == 1


def test_a_redirect_loop_ends_in_a_sentence_after_a_few_requests(mirrors, token_file):
    a, b = mirrors(), mirrors()
    a.routes[REV_PATH] = (302, {"Location": b.url + "/x"}, b"")
    b.routes["/x"] = (302, {"Location": a.url + REV_PATH}, b"")
    out = commit(a.url, token_file)
    assert "error" in out and len(a.seen) + len(b.seen) == 6  # the first request and 5 redirects
    assert all(v is None for v in b.auth()) and a.auth()[1:] == [None] * (len(a.seen) - 1)


@pytest.mark.parametrize("body", [
    b"not json", b"\xff\xfe\xfd", b"[]", b"null", b'{"sha": 5}', b'{"sha": "main"}', b'{"sha": ["x"]}',
    b'{"sha": "' + b"A" * 40 + b'"}', b'{"sha": ' + b"9" * 5000 + b"}", b"[" * 100000,
], ids=lambda v: repr(v)[:30])
def test_a_hostile_revision_answer_is_one_sentence(mirrors, token_file, body):
    a = mirrors()
    a.routes[REV_PATH] = (200, {}, body)
    out = commit(a.url, token_file)
    assert list(out) == ["error"] and a.url in out["error"]
    r = precheck(a.url + "/../nowhere", a.url, token_file)
    assert r.returncode == 1 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1


def test_unreachable_and_http_errors(mirrors, token_file, tmp_path):
    a = mirrors()
    assert "has no revision main" in commit(a.url, token_file)["error"]
    a.routes[REV_PATH] = (401, {"X-Error-Code": "GatedRepo"}, b"{}")
    r = precheck(tmp_path, a.url, token_file)
    assert r.returncode == 1 and "needs a Hugging Face token (HTTP 401 GatedRepo)" in r.stderr
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    assert "is unreachable from the host" in commit(dead, token_file)["error"]
    assert "is unreachable" in precheck(tmp_path, dead, token_file).stderr


@pytest.mark.parametrize("content, why", [
    (f"HF_TOKEN={TOKEN} extra\n", "is not a token"),
    (f"HF_TOKEN={TOKEN}\x7f\n", "is not a token"),
    ("HF_TOKEN=" + "x" * 5000 + "\n", "is not a token"),
    (None, "is not a regular file"),
])
def test_a_token_file_that_is_not_one_is_named_and_nothing_is_sent(mirrors, tmp_path, content, why):
    a = mirrors()
    a.routes[REV_PATH] = (200, {}, {"sha": SHA})
    p = tmp_path / "hf.env"
    if content is None:
        p.mkdir()
    else:
        p.write_text(content)
    assert why in commit(a.url, p)["error"] and a.seen == []
    r = precheck(tmp_path, a.url, p)
    assert r.returncode == 1 and why in r.stderr and a.seen == []


def test_no_token_file_sends_no_token(mirrors, tmp_path):
    a = mirrors()
    a.routes[REV_PATH] = (200, {}, {"sha": SHA})
    assert commit(a.url, tmp_path / "absent") == {"sha": SHA}
    assert commit(a.url, "") == {"sha": SHA}
    (tmp_path / "empty.env").write_text("OTHER=1\n")
    assert commit(a.url, tmp_path / "empty.env") == {"sha": SHA}
    assert a.auth() == [None, None, None]


def test_the_revision_and_repo_are_quoted_in_the_url(mirrors, token_file):
    a = mirrors()
    a.routes[f"/api/models/{REPO}/revision/refs%2Fpr%2F1"] = (200, {}, {"sha": SHA})
    assert commit(a.url, token_file, "refs/pr/1") == {"sha": SHA}
    commit(a.url, token_file, "x?y=1#z")
    assert a.seen[-1][0] == f"/api/models/{REPO}/revision/x%3Fy%3D1%23z"


def test_precheck_sums_the_tree_and_its_redirect_drops_the_token(mirrors, token_file, tmp_path):
    a, b = mirrors(), mirrors()
    a.routes[REV_PATH] = (200, {}, {"sha": SHA})
    a.routes[TREE_PATH] = (302, {"Location": b.url + "/tree"}, b"")
    b.routes["/tree"] = (200, {}, [{"type": "file", "size": 1000}, {"type": "directory", "size": "x"},
                                   {"type": "file", "size": None}, "junk", {"type": "file", "size": 24}])
    r = precheck(tmp_path / "new" / "dir", a.url, token_file, present=24)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["sha"] == SHA and out["total"] == 1024 and out["need"] == 1100
    assert a.auth() == [f"Bearer {TOKEN}"] * 2 and b.auth() == [None]


@pytest.mark.parametrize("tree", [
    b'{"not": "a list"}', b'[{"type": "file", "size": "1000"}]', b'[{"type": "file", "size": 1e400}]',
    b'[{"type": "file", "size": -5}]', b'[{"type": "file", "size": 100000000000000000000000}]',
    b'[{"type": "file", "size": true}]', b'[{"type": "file", "size": ' + b"9" * 5000 + b"}]", b"\xff",
], ids=lambda v: repr(v)[:40])
def test_precheck_refuses_a_hostile_file_list_in_one_sentence(mirrors, token_file, tmp_path, tree):
    a = mirrors()
    a.routes[REV_PATH] = (200, {}, {"sha": SHA})
    a.routes[TREE_PATH] = (200, {}, tree)
    r = precheck(tmp_path, a.url, token_file)
    assert r.returncode == 1 and r.stdout == "" and "left as they are" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_precheck_refuses_when_the_disk_is_short(mirrors, token_file, tmp_path):
    a = mirrors()
    a.routes[REV_PATH] = (200, {}, {"sha": SHA})
    a.routes[TREE_PATH] = (200, {}, [{"type": "file", "size": 2 ** 62}])
    r = precheck(tmp_path, a.url, token_file)
    assert r.returncode == 1 and "not enough disk for org/model" in r.stderr


def test_the_commands_carry_paths_not_the_token():
    from nemofleet.facts.weights import HubCommit
    from nemofleet.operations.weights import precheck_command
    from nemofleet import paths

    cmd = HubCommit().command("https://huggingface.co", REPO, "main")
    assert cmd.startswith("timeout 20 python3 -I -S -c ") and cmd.count(paths.HF_ENV) == 1
    assert f" commit https://huggingface.co {REPO} main {paths.HF_ENV} 15 2>/dev/null" in cmd  # deadline < timeout
    cmd = precheck_command("/srv/m/x", REPO, "main", None, paths.HF_ENV, 5)
    assert cmd.startswith("timeout 60 python3 -I -S -c ")
    assert cmd.endswith(f" precheck /srv/m/x {REPO} main https://huggingface.co {paths.HF_ENV} 5 45")
