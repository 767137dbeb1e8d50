"""The host programs (remote/*.py, as the hosts run them: the prelude, then the program) against a
host whose files are hostile, as a compromised peer's seed copy (or a hand) could leave them: a
link at a temporary or marker name pointing outside, a linked .cache/huggingface/download, a FIFO
where each file a program reads should be. Nothing outside is written, read or removed; a FIFO is
"not a regular file" at once (each run has a subprocess timeout, so a hang fails the test rather
than the suite). The prelude's own rules are tested here too, on a scratch directory."""
import ast
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemofleet import hostcmd as commands
from nemofleet import remote
from test_fleet_commands import _release, sandbox  # noqa: F401 - sandbox is the fixture
from test_remote_weights import SHARDS, check, model, run

REMOTE = Path(remote.__file__).parent
PRELUDE = (REMOTE / "_prelude.py").read_text()
PROGRAMS = sorted(p.stem for p in REMOTE.glob("*.py") if not p.name.startswith("_"))
CACHE = ".cache/huggingface/download"


def outside(tmp_path, name="precious", text="keep me"):
    """A file outside every directory a program owns, which must stay as it is."""
    p = tmp_path / "outside" / name
    p.parent.mkdir(exist_ok=True)
    p.write_text(text)
    return p


# ---------------------------------------------------------------------------- the prelude itself

def test_every_program_but_the_bare_ones_is_sent_after_the_prelude_and_defines_none_of_its_names():
    """One text of the rules: a program that defined a name of the prelude would silently replace
    it for itself (they share one namespace); every prelude name a program uses is in what it is
    sent (the deadline and HTTP part goes only to the programs that call http_request)."""
    def top_names(text):
        names = set()
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        return names

    ours = top_names(PRELUDE)
    files_part = PRELUDE[:PRELUDE.index(remote.HTTP_PART)]
    assert {"open_regular", "read_file", "write_file", "remove_tree", "deadline", "http_request"} <= ours
    for name in PROGRAMS:
        text = (REMOTE / f"{name}.py").read_text()
        assert not top_names(text) & ours, (name, top_names(text) & ours)
        sent = remote.source(name)
        compile(sent, name, "exec")
        if name in remote.BARE:
            assert sent == text
            continue
        assert files_part in sent and sent.endswith(text.split("\n", 1)[1])
        # the deadline and HTTP part goes to a program that speaks HTTP or keeps a deadline alone
        assert (PRELUDE in sent) == ("http_request(" in text or "deadline(" in text)
        used = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)} & ours
        assert used and used <= top_names(sent[:sent.index("# ---- the program\n")]), (name, used)
    assert remote.BARE == {"engine_read", "gpu_return"}


def test_only_the_prelude_speaks_http():
    """One rule for every program that speaks HTTP: no program builds its own urllib opener or
    http.client connection (engine_read speaks HTTP/1.0 to dockerd's unix socket, without the prelude)."""
    for name in PROGRAMS:
        for node in ast.walk(ast.parse((REMOTE / f"{name}.py").read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) else []
            assert not [m for m in mods if m.split(".")[0] in ("http", "ssl") or m == "urllib.request"], name


def prelude(tmp_path, code):
    """Run `code` after the prelude, as a program would, in tmp_path; its stdout."""
    r = subprocess.run([sys.executable, "-I", "-S", "-c", PRELUDE + code], capture_output=True, text=True,
                       timeout=20, cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return r.stdout


def test_the_prelude_reads_only_regular_files_and_never_through_a_link(tmp_path):
    secret = outside(tmp_path)
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "f").write_text("inside")
    (d / "link").symlink_to(secret)
    (d / "linkdir").symlink_to(secret.parent)
    os.mkfifo(d / "fifo")
    out = prelude(tmp_path, """
for name in ("sub/f", "link", "linkdir/precious", "fifo", "sub", "absent", "../outside/precious", "/etc/hostname"):
    print(name, below("d", name, read_file, 100), below("d", name, file_size))
print(read_file("d/link", 100), read_file("d/fifo", 100), read_json("d/fifo"), open_dir("d", "linkdir"))
""")
    assert out.splitlines() == [
        "sub/f b'inside' 6", "link None None", "linkdir/precious None None", "fifo None None", "sub None None",
        "absent None None", "../outside/precious None None", "/etc/hostname None None", "None None None None"]


def test_the_prelude_writes_by_rename_and_never_through_a_link(tmp_path):
    secret = outside(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    (d / "f.tmp").symlink_to(secret)  # at the temporary name
    (d / "g").symlink_to(secret)  # at the name itself
    (d / "log").symlink_to(secret)
    os.mkfifo(d / "fifo")
    out = prelude(tmp_path, """
write_file("d/f", b"one")
write_file("d/g", b"two")
for path in ("d/log", "d/fifo"):
    try:
        append_file(path, b"x")
    except OSError as exc:
        print(exc)
""")
    assert out.splitlines() == ["d/log is not a regular file", "d/fifo is not a regular file"]
    assert secret.read_text() == "keep me"
    assert (d / "f").read_text() == "one" and not (d / "f").is_symlink() and not (d / "f.tmp").exists()
    assert (d / "g").read_text() == "two" and not (d / "g").is_symlink()


def test_remove_tree_removes_links_never_their_targets(tmp_path):
    secret = outside(tmp_path)
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")
    (tree / "a" / "to-dir").symlink_to(secret.parent)
    (tree / "to-file").symlink_to(secret)
    (tmp_path / "top-link").symlink_to(secret.parent)
    prelude(tmp_path, 'remove_tree("tree")\nremove_tree("top-link")\nremove_tree("absent")\n')
    assert not tree.exists() and not (tmp_path / "top-link").exists() and secret.read_text() == "keep me"


# ---------------------------------------------------------------------------- weights_check, models_on_disk

def test_a_link_at_the_markers_temporary_name_or_at_the_marker_is_never_written_through(tmp_path):
    d, sha = model(tmp_path)
    secret = outside(tmp_path)
    (d / ".nemofleet-complete.tmp").symlink_to(secret)
    rc, out, _ = check(d, sha, "write")
    assert rc == 0 and out["marker"] and secret.read_text() == "keep me"
    marker = d / ".nemofleet-complete"
    assert not marker.is_symlink() and json.loads(marker.read_text())["revision"] == sha
    marker.unlink()
    marker.symlink_to(secret)  # a link where the marker is: replaced, never followed
    rc, out, _ = check(d, sha)
    assert rc == 0 and out["complete"] and not out["marker"]  # a link is no marker: the files were looked at
    rc, out, _ = check(d, sha, "write")
    assert rc == 0 and out["marker"] and not marker.is_symlink() and secret.read_text() == "keep me"


@pytest.mark.parametrize("linked", [CACHE, ".cache"])
def test_clean_never_removes_through_a_linked_cache(tmp_path, linked):
    """A truncated shard is cleaned with its metadata; when the metadata's directory (or .cache
    above it) is a link to elsewhere, what is there survives, and its .incomplete files are not
    counted."""
    d, sha = model(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "huggingface" / "download").mkdir(parents=True)
    meta = d / CACHE
    target = elsewhere if linked == ".cache" else elsewhere / "huggingface" / "download"
    for f in meta.iterdir():
        (elsewhere / "huggingface" / "download" / f.name).write_bytes(f.read_bytes())
    (elsewhere / "huggingface" / "download" / "x.incomplete").write_text("")
    victim = elsewhere / "huggingface" / "download" / (SHARDS[1] + ".metadata")
    import shutil
    shutil.rmtree(d / linked)
    (d / linked).symlink_to(target)
    (d / SHARDS[1]).write_bytes(b"\x01")  # truncated
    rc, out, _ = check(d, sha, "clean")
    assert rc == 0 and out["truncated"] == [SHARDS[1]] and out["incomplete_files"] == 0
    assert not out["commit_ok"]  # metadata behind a link is not this copy's metadata
    assert not (d / SHARDS[1]).exists()  # the shard itself, inside, is removed
    assert victim.exists() and (elsewhere / "huggingface" / "download" / "x.incomplete").exists()


def test_files_behind_links_are_no_files_of_the_model(tmp_path):
    """A shard or config.json that is a link (to a good copy outside, even) or inside a linked
    directory is missing: the weights check never answers complete from files outside DIR."""
    d, sha = model(tmp_path)
    keep = tmp_path / "outside-copy"
    keep.mkdir()
    for name in (SHARDS[0], "config.json"):
        (keep / name).write_bytes((d / name).read_bytes())
        (d / name).unlink()
        (d / name).symlink_to(keep / name)
    rc, out, _ = check(d, sha)
    assert rc == 0 and not out["complete"] and {SHARDS[0], "config.json"} <= set(out["missing"])
    rc, out, _ = check(d, sha, "clean")
    assert (keep / SHARDS[0]).exists() and (keep / "config.json").exists()
    rc, out, _ = run("models_on_disk", d.parent)
    assert "config" not in out[sha]  # config.json behind a link is not read


def test_models_on_disk_follows_no_link_a_marker_lists(tmp_path):
    d, sha = model(tmp_path)
    check(d, sha, "write")
    away = tmp_path / "away"
    away.mkdir()
    (away / "f").write_text("12345")
    (d / "sub").symlink_to(away)
    (d / ".nemofleet-complete").write_text(json.dumps({"revision": sha, "files": {"sub/f": 5}}))
    rc, out, _ = run("models_on_disk", d.parent)
    assert out[sha]["revision"] == sha and "marker_ok" not in out[sha]
    (d / ".nemofleet-complete").unlink()
    (d / ".nemofleet-complete").symlink_to(away / "f")
    rc, out, _ = run("models_on_disk", d.parent)
    assert out[sha]["complete"] is False and out[sha]["revision"] is None


# ---------------------------------------------------------------------------- release, lock, host_status

def timed(sandbox, cmd, check_rc=0):
    t0 = time.monotonic()
    out = sandbox(cmd, check_rc=check_rc)
    return out, time.monotonic() - t0


def test_release_read_and_keep_of_fifos_return_at_once(sandbox):
    _release(sandbox, "aaaaaaaaaaaa", {"nemofleet-vllm-nemotron-0.service": "old"})
    os.mkfifo(sandbox.units / "nemofleet-vllm-nemotron-1.service")
    out, took = timed(sandbox, commands.release_read())
    assert out["id"] == "aaaaaaaaaaaa" and len(out["units_sha256"]) == 16 and took < 10
    sandbox(commands.keep_previous())
    assert sorted(p.name for p in (sandbox.state / "previous").iterdir()) == [
        "nemofleet-vllm-nemotron-0.service", "release"]  # the FIFO is not kept
    (sandbox.state / "release").unlink()
    os.mkfifo(sandbox.state / "release")
    out, took = timed(sandbox, commands.release_read())
    assert "id" not in out and took < 10
    out, took = timed(sandbox, commands.keep_previous(), check_rc=1)
    assert "no release record at" in out["_stderr"] and took < 10


def test_keep_and_rollback_never_write_through_links(sandbox):
    secret = outside(sandbox.tmp)
    _release(sandbox, "aaaaaaaaaaaa", {"nemofleet-vllm-nemotron-0.service": "old"})
    (sandbox.state / "previous.new").symlink_to(secret.parent)  # the keep's temporary directory
    sandbox(commands.keep_previous())
    assert secret.read_text() == "keep me" and sorted(p.name for p in secret.parent.iterdir()) == ["precious"]
    assert (sandbox.state / "previous" / "release").read_text().startswith("id=aaaaaaaaaaaa")
    _release(sandbox, "bbbbbbbbbbbb", {"nemofleet-vllm-nemotron-0.service": "new"})
    for name in ("nemofleet-vllm-nemotron-0.service.tmp", "release.tmp", "release.rolled-back.tmp"):
        target = sandbox.units if name.startswith("nemofleet") else sandbox.state
        (target / name).symlink_to(secret)
    (sandbox.state / "release.rolled-back").symlink_to(secret)
    out = sandbox(commands.rollback(expect="aaaaaaaaaaaa"))
    assert "rolled back to aaaaaaaaaaaa" in out["_stdout"] and secret.read_text() == "keep me"
    unit = sandbox.units / "nemofleet-vllm-nemotron-0.service"
    assert unit.read_text() == "old" and not unit.is_symlink()
    assert (sandbox.state / "release.rolled-back").read_text().startswith("id=bbbbbbbbbbbb")


def test_a_rollback_refuses_a_kept_unit_that_is_a_fifo_or_a_link(sandbox):
    secret = outside(sandbox.tmp, text="[Service]\nExecStart=/bin/evil\n")
    _release(sandbox, "aaaaaaaaaaaa", {"nemofleet-vllm-nemotron-0.service": "old"})
    sandbox(commands.keep_previous())
    kept = sandbox.state / "previous" / "nemofleet-vllm-nemotron-0.service"
    kept.unlink()
    kept.symlink_to(secret)
    out, took = timed(sandbox, commands.rollback(expect="aaaaaaaaaaaa"), check_rc=1)
    assert "is not a regular file" in out["_stderr"] and took < 10
    assert (sandbox.units / "nemofleet-vllm-nemotron-0.service").read_text() == "old"  # not the link's text
    kept.unlink()
    os.mkfifo(kept)
    out, took = timed(sandbox, commands.rollback(expect="aaaaaaaaaaaa"), check_rc=1)
    assert "is not a regular file" in out["_stderr"] and took < 10


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_the_audit_log_is_never_a_fifo_or_a_link(sandbox, kind):
    secret = outside(sandbox.tmp)
    log = sandbox.state / "audit.log"
    os.mkfifo(log) if kind == "fifo" else log.symlink_to(secret)
    out, took = timed(sandbox, commands.audit_command("alice", "rollout", "x"), check_rc=1)
    assert "is not a regular file" in out["_stderr"] and took < 10 and secret.read_text() == "keep me"


def test_a_lock_refresh_never_writes_through_a_link_at_its_temporary_name(sandbox):
    secret = outside(sandbox.tmp)
    assert sandbox(commands.lock_acquire("alice@ctl", "t1", 60, ""))["state"] == "ACQUIRED"
    (sandbox.state / "lock" / "info.tmp").symlink_to(secret)
    assert sandbox(commands.lock_refresh("t1", 900))["state"] == "REFRESHED"
    assert secret.read_text() == "keep me" and not (sandbox.state / "lock" / "info").is_symlink()
    assert sandbox(commands.lock_status())["holder"] == "alice@ctl"


def test_status_reads_no_fifo_and_no_link(sandbox):
    """Every file host_status reads, a FIFO or a link to a file that would print: it answers at
    once without them."""
    secret = outside(sandbox.tmp, text="2026-12-03T00:00:00Z evil canary pass 9\n")
    models, prom = sandbox.tmp / "models", sandbox.tmp / "prom"
    d = models / "m"
    d.mkdir(parents=True)
    prom.mkdir()
    health = sandbox.state / "health"
    health.mkdir()
    fifos = [sandbox.state / "release", prom / "nemofleet.prom", health / "gpu-GPU-1.sick",
             sandbox.units / "nemofleet-vllm-nemotron-0.service", d / "model.safetensors.index.json",
             d / "model.safetensors", d / ".nemofleet-complete"]
    for f in fifos:
        os.mkfifo(f)
    (sandbox.state / "audit.log").symlink_to(secret)
    (sandbox.bin / "systemctl").write_text("#!/bin/sh\necho active\n")
    t0 = time.monotonic()
    lines = sandbox(commands.status(str(models), str(prom)))["_stdout"].splitlines()
    assert time.monotonic() - t0 < 20
    assert lines == ["unit nemofleet-vllm-nemotron-0.service active ", "weights m 0 of ? tensor bytes, incomplete"]


# ---------------------------------------------------------------------------- health, smoke, metrics, hub

def test_health_reads_no_fifo_and_writes_through_no_link(tmp_path):
    from test_remote_health import run as health_run, setup as health_setup

    plan = health_setup(tmp_path, auth_header=str(tmp_path / "api-auth.header"))
    secret = outside(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    for name in ("nemotron-0.state", "nemotron-0.fails.tmp"):
        (state / name).symlink_to(secret)
    os.mkfifo(state / "nemotron-1.last_success")
    (tmp_path / "health.conf").unlink()
    os.mkfifo(tmp_path / "health.conf")
    os.mkfifo(tmp_path / "api-auth.header")
    (tmp_path / "prom").mkdir()
    (tmp_path / "prom" / "nemofleet.prom.tmp").symlink_to(secret)
    t0 = time.monotonic()
    r = health_run(tmp_path, plan)
    assert r.returncode == 0 and "instance nemotron-0 healthy" in r.stdout and time.monotonic() - t0 < 30, r.stdout
    assert secret.read_text() == "keep me"
    assert (state / "nemotron-0.state").read_text() == "up\n" and not (state / "nemotron-0.state").is_symlink()
    assert "nemofleet_vllm_up" in (tmp_path / "prom" / "nemofleet.prom").read_text()
    calls = (tmp_path / "curl.calls").read_text()
    assert " -H @" not in calls  # the header file is a FIFO: never handed to curl
    fifo_config = tmp_path / "fifo.json"
    os.mkfifo(fifo_config)
    r = health_run(tmp_path, plan, config="fifo.json")
    assert r.returncode == 1 and "cannot read its config" in r.stdout


def smoke_on_host(tmp_path, files: dict, port=1, deadline=None):
    """remote/smoke.py as `nemofleet smoke` sends it, its three files made by `files` (name ->
    "fifo", "absent" or text) in tmp_path."""
    from nemofleet import paths
    from nemofleet.fleet import smoke

    text = smoke.script("hi")
    for p in (paths.API_AUTH, paths.HEALTH_CONFIG, paths.FRONT_DOOR_CFG):
        text = text.replace(p, str(tmp_path / Path(p).name))
    if deadline:
        text = text.replace(f" {smoke.CURL_MAX_TIME} <<", f" {deadline} <<")
    for name, what in files.items():
        if what == "fifo":
            os.mkfifo(tmp_path / name)
        elif what != "absent":
            (tmp_path / name).write_text(what)
    t0 = time.monotonic()
    r = subprocess.run(["sh", "-c", text], capture_output=True, text=True, timeout=30)
    return smoke.parse("h", r.returncode, r.stdout + r.stderr), time.monotonic() - t0


CONFIG = json.dumps({"address": "127.0.0.1", "instances": [{"name": "n", "port": 1, "model": "m", "unit": "u"}]})


@pytest.mark.parametrize("files, error", [
    ({"api-auth.header": "fifo"}, "its API key file {t}/api-auth.header is not a regular file: deploy it again"),
    ({"api-auth.header": "Authorization: Bearer k\n", "health.json": "fifo"},
     "its {t}/health.json is not JSON (or no regular file): deploy it again"),
    ({"api-auth.header": "Authorization: Bearer k\n", "health.json": CONFIG, "haproxy.cfg": "fifo"},
     "no HTTP answer from instance 127.0.0.1:1: [Errno 111] Connection refused"),
], ids=["header", "config", "haproxy"])
def test_smoke_answers_at_once_where_a_file_is_a_fifo(tmp_path, files, error):
    a, took = smoke_on_host(tmp_path, files)
    assert not a.ok and a.error == error.format(t=tmp_path) and took < 10


def test_metrics_answers_at_once_where_its_files_are_fifos(tmp_path):
    from nemofleet import shell
    os.mkfifo(tmp_path / "health.json")
    os.mkfifo(tmp_path / "auth")
    line = shell.join(remote.argv("metrics", tmp_path / "health.json", tmp_path / "auth", 5, 10))
    t0 = time.monotonic()
    r = subprocess.run(["sh", "-c", line.replace("python3 ", shlex.quote(sys.executable) + " ", 1)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("@@gpu") and "@@instance" not in r.stdout
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_hub_refuses_a_token_file_that_is_a_fifo_or_a_link(tmp_path, kind):
    from test_remote_hub import TOKEN, commit

    token = tmp_path / "hf.env"
    real = outside(tmp_path, "hf.env", f"HF_TOKEN={TOKEN}\n")
    os.mkfifo(token) if kind == "fifo" else token.symlink_to(real)
    t0 = time.monotonic()
    out = commit("http://127.0.0.1:9", token)
    assert out == {"error": f"the token file {token} is not a regular file (or is unreadable)"}
    assert time.monotonic() - t0 < 10
