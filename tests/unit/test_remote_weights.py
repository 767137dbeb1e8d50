"""remote/weights_check.py and remote/models_on_disk.py run as the hosts run them
(`python3 -I -S -c <remote.source(NAME)> ARGS`) against hostile model directories: an index, shard headers and a
marker of the wrong type, bytes that are not UTF-8, FIFOs, symlink loops, numbers of any size.
Each run ends in one JSON line (never a traceback, never a hang), nothing outside the directory
is read or removed, and a complete model is still found complete (so nothing is fetched again
because of a bad marker)."""
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from nemofleet import remote
from nemofleet_testbed import tinymodel

REMOTE = Path(remote.__file__).parent
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
INDEX = "model.safetensors.index.json"


def run(program, *args):
    r = subprocess.run([sys.executable, *remote.argv(program, *args)[1:]],
                       capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]})
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout
    return r.returncode, json.loads(lines[0]), r.stderr


def check(d, rev, mode="check"):
    return run("weights_check", d, rev, mode)


def model(tmp_path):
    """A generated checkpoint as `hf download --local-dir` leaves it (metadata of commit `sha`)."""
    sha = tinymodel.build(str(tmp_path / "repos"), "org/tiny")
    d = tmp_path / "repos" / "org/tiny" / sha
    meta = d / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    for f in d.iterdir():
        if f.is_file():
            import hashlib
            (meta / (f.name + ".metadata")).write_text(f"{sha}\n{hashlib.sha256(f.read_bytes()).hexdigest()}\n0\n")
    return d, sha


def write_index(d, value):
    (d / INDEX).write_bytes(value if isinstance(value, bytes) else json.dumps(value).encode())


def test_a_complete_model_is_checked_written_and_then_answered_from_its_marker(tmp_path):
    d, sha = model(tmp_path)
    rc, out, _ = check(d, sha)
    assert rc == 0 and out["complete"] and out["commit_ok"] and not out["marker"]
    rc, out, _ = check(d, sha, "write")
    assert rc == 0 and out["marker"] and (d / ".nemofleet-complete").exists()
    rc, out, _ = check(d, sha)
    assert out["complete"] and out["marker"] and "commit_ok" not in out  # the fast path


@pytest.mark.parametrize("index", [
    b"{not json", b"\xff\xfe\x00garbage", b'"a string"', b"[1, 2]", b"null",
    {"weight_map": [SHARDS[0]]},
    {"weight_map": {"a": 5}},
    {"weight_map": {"a": ["x"]}},
    {"weight_map": {"a": None}},
    {"weight_map": {}},
    {"weight_map": {"a": "../outside.safetensors"}},
    {"weight_map": {"a": "/etc/passwd"}},
    {"weight_map": {"a": "-h"}},
    {"weight_map": {"a": "sub/../../outside.safetensors"}},
    {"weight_map": {"a": "x\nnext"}},
    {"weight_map": {"a": "x\x00y"}},
    b"[" * 100000 + b"]" * 100000,  # nested past the recursion limit
], ids=lambda v: repr(v)[:40])
def test_a_hostile_index_counts_as_truncated_and_is_never_followed(tmp_path, index):
    d, sha = model(tmp_path)
    outside = tmp_path / "repos" / "org" / "outside.safetensors"
    outside.write_bytes(b"keep me")
    write_index(d, index)
    for mode in ("check", "full", "clean"):
        rc, out, _ = check(d, sha, mode)
        assert rc == (1 if mode == "full" else 0) and not out["complete"]  # full fails when incomplete
        assert INDEX in out["truncated"] and not any(".." in m or m.startswith(("/", "-")) for m in out["missing"])
    rc, out, err = check(d, sha, "write")
    assert rc == 1 and "incomplete after download" in err
    assert outside.read_bytes() == b"keep me"  # clean never removes a file the index names outside
    assert not (d / INDEX).exists()  # clean removed the index itself, so it is fetched again


@pytest.mark.parametrize("total", [10 ** 30, -1, "262144", 1e400, True, [1]], ids=repr)
def test_index_total_size_of_any_size_or_type(tmp_path, total):
    d, sha = model(tmp_path)
    index = json.loads((d / INDEX).read_text())
    index["metadata"]["total_size"] = total
    (d / INDEX).write_text(json.dumps(index))  # 1e400 is written as Infinity, which json reads back
    rc, out, _ = check(d, sha)
    assert rc == 0 and out["complete"] and out["total_size"] is None
    assert "Infinity" not in json.dumps(out)


def shard_with_header(header: bytes, n=None, extra=b""):
    return struct.pack("<Q", len(header) if n is None else n) + header + extra


@pytest.mark.parametrize("content", [
    b"", b"\x01\x02", shard_with_header(b"{}", n=2 ** 64 - 1), shard_with_header(b"{}", n=2 ** 40),
    shard_with_header(b"[1, 2]"), shard_with_header(b'"x"'), shard_with_header(b"\xff\xfe{}"),
    shard_with_header(b'{"t": {"data_offsets": ["0", "4"]}}', extra=b"1234"),
    shard_with_header(b'{"t": {"data_offsets": [true, true]}}', extra=b"1"),
    shard_with_header(b'{"t": {"data_offsets": [0, 1e400]}}', extra=b"1234"),
    shard_with_header(b'{"t": {"data_offsets": [0, 100000000000000000000000000000]}}', extra=b"1234"),
    shard_with_header(b'{"t": {"data_offsets": [4, 0]}}', extra=b"1234"),
    shard_with_header(b'{"t": {"data_offsets": [0]}}', extra=b"1234"),
    shard_with_header(b'{"t": "offsets"}', extra=b"1234"),
    shard_with_header(b'{"t": {"data_offsets": [0, 4]}, "u": 7}', extra=b"1234"),
    shard_with_header(b'{"t": {"data_offsets": [0, ' + b"9" * 5000 + b"]}}", extra=b"1234"),
], ids=lambda v: repr(v)[:40])
def test_a_hostile_shard_header_is_truncated(tmp_path, content):
    d, sha = model(tmp_path)
    (d / SHARDS[1]).write_bytes(content)
    rc, out, _ = check(d, sha)
    assert rc == 0 and out["truncated"] == [SHARDS[1]] and not out["complete"]
    rc, out, _ = check(d, sha, "clean")
    assert not (d / SHARDS[1]).exists() and (d / SHARDS[0]).exists()
    assert not (d / ".cache/huggingface/download" / (SHARDS[1] + ".metadata")).exists()


@pytest.mark.parametrize("marker", [
    b"garbage", b"\xff\xfe", b"[]", {"revision": 5, "files": {}}, {"files": []},
    {"files": {"config.json": "12"}}, {"files": {"config.json": 10 ** 40}}, {"files": {"config.json": -1}},
    {"files": {"../../../../etc/hostname": 1}}, {"files": {"/etc/hostname": 1}}, {"files": {"": 0}},
    {"files": {}, "total_size": 1e400},
], ids=lambda v: repr(v)[:40])
def test_a_bad_marker_falls_back_to_the_files_and_a_complete_model_stays_complete(tmp_path, marker):
    d, sha = model(tmp_path)
    value = marker if isinstance(marker, bytes) else json.dumps({"revision": sha, **marker}).encode()
    (d / ".nemofleet-complete").write_bytes(value)
    rc, out, _ = check(d, sha)
    if isinstance(marker, dict) and marker.get("files") == {} and "revision" not in marker:
        # an empty file list of this revision is intact (nothing listed changed): its total is not a size
        assert out["marker"] and out["total_size"] is None
    else:
        # looked at the files: complete, so nothing is fetched again; write re-marks it
        assert rc == 0 and out["complete"] and not out["marker"]
        rc, out, _ = check(d, sha, "write")
        assert rc == 0 and out["marker"]
        assert json.loads((d / ".nemofleet-complete").read_text())["revision"] == sha


def test_fifos_devices_and_symlink_loops_are_never_read(tmp_path):
    d, sha = model(tmp_path)
    check(d, sha, "write")
    for name in (".nemofleet-complete", INDEX, "config.json"):
        (d / name).unlink()
        os.mkfifo(d / name)
    (d / SHARDS[0]).unlink()
    os.symlink(SHARDS[0], d / SHARDS[0])  # points at itself: ELOOP
    os.symlink("loop-b", d / "loop-a")
    os.symlink("loop-a", d / "loop-b")
    os.symlink("/dev/zero", d / "tokenizer.json.zero")
    meta = d / ".cache/huggingface/download" / (SHARDS[1] + ".metadata")
    meta.unlink()
    os.mkfifo(meta)
    for mode in ("check", "full", "clean"):
        rc, out, _ = check(d, sha, mode)  # run() times out after 30 s were anything waited on
        assert rc == (1 if mode == "full" else 0) and not out["complete"] and INDEX in out["missing"] and "config.json" in out["missing"]
    rc, out, _ = run("models_on_disk", d.parent)
    # a FIFO where the marker should be is no marker (host_status and the weights check agree)
    assert out[sha]["complete"] is False and out[sha]["revision"] is None and "marker_ok" not in out[sha]


def test_a_model_directory_that_is_a_symlink_loop_or_missing(tmp_path):
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    for d in (tmp_path / "loop", tmp_path / "absent"):
        rc, out, _ = check(d, "a" * 40)
        assert rc == 0 and not out["exists"] and not out["complete"]
        rc, out, err = check(d, "a" * 40, "write")
        assert rc == 1 and "does not exist" in err
    rc, out, _ = run("models_on_disk", tmp_path / "loop")
    assert out == {}


def test_names_that_are_not_utf8_and_metadata_that_is_not_either(tmp_path):
    d, sha = model(tmp_path)
    with open(os.path.join(os.fsencode(d), b"odd-\xff-name.json"), "wb") as f:
        f.write(b"{}")
    os.makedirs(os.path.join(os.fsencode(d.parent), b"dir-\xfe"))
    meta = d / ".cache/huggingface/download" / (SHARDS[0] + ".metadata")
    meta.write_bytes(b"\xff\xfe\xfd\n\xff\n")
    for mode in ("check", "full"):
        rc, out, _ = check(d, sha, mode)
        assert rc == (1 if mode == "full" else 0) and not out["commit_ok"] and out["other_commits"] == ["\ufffd\ufffd\ufffd"]
    assert check(d, sha, "full")[1]["truncated"] == [SHARDS[0]]  # its etag no longer matches
    rc, out, err = check(d, sha, "write")
    assert rc == 1 and "not of commit" in err
    rc, out, _ = run("models_on_disk", d.parent)
    assert sha in out and "dir-\udcfe" in out  # a name that is not UTF-8 reaches the controller escaped


def test_models_on_disk_keeps_only_values_of_the_right_type(tmp_path):
    d, sha = model(tmp_path)
    check(d, sha, "write")
    rc, out, _ = run("models_on_disk", d.parent)
    assert out[sha]["revision"] == sha and out[sha]["marker_ok"]["present_bytes"] > 0
    assert out[sha]["total_size"] == 262144 and out[sha]["config"]["num_key_value_heads"] == 2
    write_index(d, {"metadata": {"total_size": 10 ** 40}})
    (d / "config.json").write_bytes(b"[1]")
    (d / ".nemofleet-complete").write_text(json.dumps({"revision": ["x"], "files": {"../x": 1}}))
    rc, out, _ = run("models_on_disk", d.parent)
    assert out[sha] == {"complete": True, "revision": None}
    (d / ".nemofleet-complete").write_text(json.dumps({"revision": sha, "files": {"/etc/hostname": 1}}))
    assert "marker_ok" not in run("models_on_disk", d.parent)[1][sha]


def test_the_programs_are_what_nemofleet_sends():
    """`remote.argv` sends the prelude, then the file's own text (engine_read: the file alone):
    what these tests run is what the hosts run."""
    for name in ("weights_check", "models_on_disk", "hub", "engine_read"):
        argv = remote.argv(name, "a b", "$(x)")
        text = (REMOTE / f"{name}.py").read_text()
        assert argv[:4] == ["python3", "-I", "-S", "-c"] and argv[4] == remote.source(name)
        assert argv[4] == text if name in remote.BARE else argv[4].endswith("# ---- the program\n" + text)
        assert argv[5:] == ["a b", "$(x)"]
        compile(argv[4], name, "exec")


def test_the_programs_import_only_the_standard_library():
    import ast
    for path in REMOTE.glob("*.py"):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        # the one import never run: the prelude's names for the type checker, under
        # `if TYPE_CHECKING:` (TYPE_CHECKING = False in the program; the prelude is sent before it)
        typing_only = [n for n in ast.walk(tree) if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"]
        for block in typing_only:
            assert [(type(b).__name__, getattr(b, "module", None), getattr(b, "level", 0)) for b in block.body] == [
                ("ImportFrom", "_prelude", 1)], path.name
        skip = {id(b) for block in typing_only for b in block.body}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) else []
            for n in names:
                top = n.split(".")[0]
                assert top in sys.stdlib_module_names and top != "nemofleet", (path.name, n)
