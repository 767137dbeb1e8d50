"""The offline completeness check that runs on hosts (stdlib python3), on a generated model."""
import json
import os
import subprocess
import sys

from nemofleet.facts.weights import CHECK_SCRIPT
from nemofleet_testbed import tinymodel


def check(d, rev, mode="check"):
    r = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, d, rev, mode], capture_output=True, text=True)
    return r.returncode, json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def model(tmp_path, metadata=True):
    """A generated checkpoint laid out as `hf download --local-dir` leaves it: each file's
    metadata (commit, etag, timestamp) under .cache/huggingface/download."""
    sha = tinymodel.build(str(tmp_path / "repos"), "org/tiny")
    d = str(tmp_path / "repos" / "org/tiny" / sha)
    if metadata:
        meta = os.path.join(d, ".cache", "huggingface", "download")
        os.makedirs(meta)
        for name in os.listdir(d):
            if os.path.isfile(os.path.join(d, name)):
                import hashlib
                etag = hashlib.sha256(open(os.path.join(d, name), "rb").read()).hexdigest()
                with open(os.path.join(meta, name + ".metadata"), "w") as f:
                    f.write(f"{sha}\n{etag}\n1700000000.0\n")
    return d, sha


def test_marker_refused_for_files_not_of_the_commit(tmp_path):
    d, sha = model(tmp_path, metadata=False)
    rc, out, err = check(d, sha, "write")
    assert rc == 1 and out["complete"] and not out["commit_ok"] and "not of commit" in err
    assert not os.path.exists(os.path.join(d, ".nemofleet-complete"))
    d2, sha2 = model(tmp_path / "b")
    rc, out, _ = check(d2, "f" * 40, "write")  # files of another commit
    assert rc == 1 and out["other_commits"] == [sha2]


def test_complete_then_marker_fast_path(tmp_path):
    d, sha = model(tmp_path)
    rc, out, _ = check(d, sha)
    assert rc == 0 and out["complete"] and not out["marker"] and out["total_size"] == 262144
    rc, out, _ = check(d, sha, "write")
    assert rc == 0 and os.path.exists(os.path.join(d, ".nemofleet-complete"))
    rc, out, _ = check(d, sha)
    assert out["complete"] and out["marker"]
    assert not check(d, "f" * 40)[1]["marker"]  # marker is per revision


def test_truncated_and_missing_shards_and_incomplete_files(tmp_path):
    d, sha = model(tmp_path)
    check(d, sha, "write")
    shard = os.path.join(d, "model-00002-of-00002.safetensors")
    os.truncate(shard, 1000)
    os.remove(os.path.join(d, "config.json"))
    os.makedirs(os.path.join(d, ".cache/huggingface/download"), exist_ok=True)
    open(os.path.join(d, ".cache/huggingface/download/x.abc.incomplete"), "w").close()
    rc, out, _ = check(d, sha)
    assert not out["complete"] and out["truncated"] == ["model-00002-of-00002.safetensors"]
    assert out["missing"] == ["config.json"] and out["incomplete_files"] == 1
    rc, out, err = check(d, sha, "write")
    assert rc == 1 and "incomplete after download" in err


def test_full_verify_catches_corruption_of_same_size(tmp_path):
    d, sha = model(tmp_path)
    shard = os.path.join(d, "model-00001-of-00002.safetensors")
    import hashlib
    meta = os.path.join(d, ".cache/huggingface/download/model-00001-of-00002.safetensors.metadata")
    os.makedirs(os.path.dirname(meta), exist_ok=True)
    open(meta, "w").write(f"{sha}\n{hashlib.sha256(open(shard, 'rb').read()).hexdigest()}\n0\n")
    assert check(d, sha, "full")[1]["complete"]
    with open(shard, "r+b") as f:
        f.seek(-1, 2)
        f.write(b"\x00")
    assert check(d, sha, "full")[1]["truncated"] == ["model-00001-of-00002.safetensors"]


def _fake_rsync(tmp_path, source_dir):
    """An `rsync` on PATH (the marker excluded, as --exclude does): peer `dead` dies mid-copy (one shard half-written, exit 30 as on
    --timeout), peer `gone` never answers (ssh's exit 255), any other peer copies everything (as rsync --partial resumes)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rsync").write_text(f"""#!/bin/sh
for a; do dest=$a; done
case "$*" in
  *@gone:*) exit 255;;
  *--list-only*@dead:*.nemofleet-complete*) exit 23;;
  *--list-only*@dead:*) echo "-rw-r--r--      1,000 2026/12/04 12:00:00 model-00001-of-00002.safetensors"; exit 0;;
  *--list-only*) exit 0;;
  *@dead:*) cp -a {source_dir}/. "$dest"; rm -f "$dest/.nemofleet-complete"; f=$(ls "$dest"/model-00002*); head -c 1000 "$f" > "$f.x"; mv "$f.x" "$f"; exit 30;;
  *) cp -a {source_dir}/. "$dest"; rm -f "$dest/.nemofleet-complete";;
esac
""")
    (bin_dir / "rsync").chmod(0o755)
    (bin_dir / "sleep").write_text("#!/bin/sh\n")  # the wait for a source that is still fetching: no real time
    (bin_dir / "sleep").chmod(0o755)
    return str(bin_dir)


def test_a_killed_source_is_replaced_and_a_half_copy_never_marked(tmp_path):
    from nemofleet.operations.weights import seed_lines

    src, sha = model(tmp_path / "src")
    check(src, sha, "write")  # the source holds a verified copy
    env = dict(os.environ, PATH=_fake_rsync(tmp_path, src) + ":" + os.environ["PATH"])
    for peers, resumed in ((["dead", "good"], True), (["dead"], False), ([{"host": "dead", "wait": 20}, "good"], True)):
        dest = str(tmp_path / f"dest-{len(peers)}-{isinstance(peers[0], dict)}")
        os.makedirs(dest)
        script = "\n".join(seed_lines([{"root": str(tmp_path), **(p if isinstance(p, dict) else {"host": p})}
                                        for p in peers], dest, sha)
                           + ["echo 'on to hf download'"]).replace("python3 ", sys.executable + " ")
        r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)
        assert "seeding from dead failed" in r.stderr
        # a source still fetching is waited for while it grows; one that shows no progress is skipped
        assert ("made no progress for 20 s" in r.stderr) == isinstance(peers[0], dict)
        assert ("no download needed" in r.stdout) == resumed and ("on to hf download" in r.stdout) != resumed
        assert not os.path.exists(os.path.join(dest, ".nemofleet-complete"))  # the copy never marks itself
        rc, out, _ = check(dest, sha, "write")  # the weights operation's check runs on arrival
        # no source had it: the half-written shard (and its copied metadata) is gone, so that
        # `hf download` fetches it instead of trusting the metadata
        assert (rc == 0 and out["marker"]) if resumed else (
            rc == 1 and out["missing"] == ["model-00002-of-00002.safetensors"] and not out["truncated"]
            and not os.path.exists(os.path.join(dest, ".cache/huggingface/download/model-00002-of-00002.safetensors.metadata")))


def test_held_peers_are_asked_not_waited_for_and_a_source_that_never_begins_is_skipped(tmp_path):
    from nemofleet.operations.weights import seed_lines

    src, sha = model(tmp_path / "src")
    check(src, sha, "write")
    env = dict(os.environ, PATH=_fake_rsync(tmp_path, src) + ":" + os.environ["PATH"])

    def run(peers, name):
        dest = str(tmp_path / name)
        os.makedirs(dest)
        script = "\n".join(["set -e"] + seed_lines([{"root": str(tmp_path), **p} for p in peers], dest, sha)
                            + ["echo 'on to hf download'"]).replace("python3 ", sys.executable + " ")
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env), dest

    # a converge's origin fetcher: `dead` holds no verified copy (no marker) and is not copied from;
    # `good` holds one and is
    r, dest = run([{"host": "dead", "held": True}, {"host": "good", "held": True}], "held")
    assert "dead holds no verified copy now: not copied from" in r.stdout and "seeding from dead" not in r.stderr
    assert "seeded" in r.stdout and "no download needed" in r.stdout and "on to hf download" not in r.stdout
    assert not os.path.exists(os.path.join(dest, "model-00002-of-00002.safetensors.x"))
    # nobody holds it: on to the origin, nothing copied
    r, dest = run([{"host": "dead", "held": True}], "nobody")
    assert r.returncode == 0 and "on to hf download" in r.stdout and os.listdir(dest) == []
    # a source that never began (refused, or down): skipped after `start`, long before `wait`
    r, dest = run([{"host": "gone", "wait": 600, "start": 30}, {"host": "good"}], "start")
    assert "source gone did not begin fetching within 30 s" in r.stderr and "no progress" not in r.stderr
    assert "no download needed" in r.stdout


def test_the_seed_copy_brings_regular_files_and_directories_only(tmp_path):
    """The copy from a peer (that peer maybe compromised), run with the real rsync and the flags the
    operation gives it: no link (to outside, or a linked .cache), no FIFO, no setuid bit and no
    marker arrive; a link left at the destination is replaced by the directory the peer sends."""
    import re
    import shutil
    import stat

    import pytest
    from nemofleet.operations.weights import seed_lines

    if not shutil.which("rsync"):
        pytest.skip("no rsync here")
    src, sha = model(tmp_path / "src")
    check(src, sha, "write")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    os.symlink(outside / "precious", os.path.join(src, "tokenizer.model"))
    os.symlink(outside, os.path.join(src, ".cache", "huggingface", "elsewhere"))
    os.mkfifo(os.path.join(src, "fifo"))
    with open(os.path.join(src, "run-me"), "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(os.path.join(src, "run-me"), 0o4755)
    os.makedirs(os.path.join(src, "sub"))
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(outside, dest / "sub")  # left by an older copy: never written through
    script = "\n".join(seed_lines({"host": "peer", "root": str(tmp_path)}, str(dest), sha))
    flags = re.search(r"rsync (-[^']*?) -e ", script).group(1).split()
    assert "-a" not in flags and flags[0] == "-rt"
    r = subprocess.run(["rsync", *flags, src + "/", f"{dest}/"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    found = {str(p.relative_to(dest)): p.lstat().st_mode for p in dest.rglob("*")}
    assert not [n for n, m in found.items() if not (stat.S_ISREG(m) or stat.S_ISDIR(m))], found
    assert "tokenizer.model" not in found and "fifo" not in found and ".nemofleet-complete" not in found
    assert stat.S_ISDIR(found["sub"]) and not found["run-me"] & (stat.S_ISUID | stat.S_ISGID)
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]
    assert check(str(dest), sha)[1]["complete"]
