"""Testbed reuse: a container of the same name made by another checkout is replaced (or, when it
is not a test host at all, refused with one sentence), never silently reused."""
from nemofleet_testbed import DIR_LABEL, OWNER_LABEL, reuse_decision

PUB = "ssh-ed25519 AAAAC3Nz-mine nemofleet-testbed\n"
NAME = "nf-tb-h200-1"


def test_no_container_is_created():
    assert reuse_decision(NAME, None, "f00d", PUB) == ("create", None)


def test_our_own_host_is_reused():
    assert reuse_decision(NAME, {"nemofleet.testbed": "1", OWNER_LABEL: "f00d"}, "f00d", PUB) == ("reuse", None)


def test_unlabelled_host_that_takes_our_key_is_reused():
    labels = {"nemofleet.testbed": "1"}  # made before the owner label existed
    assert reuse_decision(NAME, labels, "f00d", PUB, authorized=PUB) == ("reuse", None)


def test_another_checkouts_host_is_replaced_with_a_sentence():
    labels = {"nemofleet.testbed": "1", OWNER_LABEL: "beef", DIR_LABEL: "/work/other/.testbed"}
    action, why = reuse_decision(NAME, labels, "f00d", PUB, here="/work/main/.testbed")
    assert action == "replace"
    assert why == ("nf-tb-h200-1 is a test host of another testbed (/work/other/.testbed) that does not accept "
                   "this testbed's SSH key (/work/main/.testbed); replacing it (set NEMOFLEET_TESTBED_NAME to keep both)")
    action, why = reuse_decision(NAME, {"nemofleet.testbed": "1"}, "f00d", PUB, authorized="ssh-ed25519 other x\n")
    assert action == "replace" and "an older checkout" in why


def test_a_foreign_container_of_that_name_is_refused():
    action, why = reuse_decision(NAME, {"maintainer": "someone"}, "f00d", PUB)
    assert action == "refuse"
    assert why == ("a container named nf-tb-h200-1 exists and is not a nemofleet test host; remove it "
                   "(docker rm -f nf-tb-h200-1) or choose another prefix with NEMOFLEET_TESTBED_NAME")
    assert reuse_decision(NAME, {}, "f00d", PUB)[0] == "refuse"


def test_mirror_streams_files_counts_their_bytes_and_bounds_its_uplink(tmp_path):
    """The testbed's Hub mirror: a file download (whole or a Range) is streamed and its bytes
    counted in <log>.bytes (API calls are not); `uplink-rate` beside the log bounds all downloads."""
    import hashlib
    import threading
    import time
    import urllib.request
    from http.server import ThreadingHTTPServer

    from nemofleet_testbed import hfmirror, tinymodel

    sha = tinymodel.build(str(tmp_path / "repos"), "org/m")
    log = tmp_path / "requests.log"
    hfmirror.Handler.root, hfmirror.Handler.log_path = str(tmp_path / "repos"), str(log)
    hfmirror.UPLINK.path = str(tmp_path / "uplink-rate")
    server = ThreadingHTTPServer(("127.0.0.1", 0), hfmirror.Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        shard = "model-00001-of-00002.safetensors"
        tree = {f["path"]: f for f in __import__("json").load(urllib.request.urlopen(f"{base}/api/models/org/m/tree/{sha}"))}
        data = urllib.request.urlopen(f"{base}/org/m/resolve/{sha}/{shard}").read()
        assert hashlib.sha256(data).hexdigest() == tree[shard]["lfs"]["oid"] and len(data) == tree[shard]["size"]
        req = urllib.request.Request(f"{base}/org/m/resolve/{sha}/{shard}", headers={"Range": "bytes=100-"})
        part = urllib.request.urlopen(req)
        assert part.status == 206 and part.read() == data[100:]
        (tmp_path / "uplink-rate").write_text(str(len(data)))  # one shard per second
        hfmirror.UPLINK._read = 0.0
        t0 = time.monotonic()
        urllib.request.urlopen(f"{base}/org/m/resolve/{sha}/{shard}").read()
        urllib.request.urlopen(f"{base}/org/m/resolve/{sha}/{shard}").read()
        assert time.monotonic() - t0 >= 1.5
        # the mirror counts a download after its last byte is sent, so the client may read it all first
        # (and a count may land after the next download's): wait (bounded) for the fourth line, any order
        deadline = time.monotonic() + 5
        while len((tmp_path / "requests.log.bytes").read_text().splitlines()) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        counted = [int(line.split()[0]) for line in (tmp_path / "requests.log.bytes").read_text().splitlines()]
        assert sorted(counted) == sorted([len(data), len(data) - 100, len(data), len(data)])
    finally:
        server.shutdown()
        hfmirror.UPLINK.path = None


# --- the testbed is its own package (testbed/, nemofleet-testbed), not in nemofleet's wheel ------

def test_the_testbed_package_finds_its_files_the_repository_and_nemofleets_flag_table():
    from pathlib import Path

    import nemofleet_testbed
    from nemofleet import vllm_flags
    from nemofleet_testbed import images, load_profiles, scale

    here = Path(nemofleet_testbed.__file__).resolve().parent
    assert images.HERE == here
    assert {"nvidia-smi", "nvidia-ctk", "nvidia-container-runtime-hook", "dmesg", "nemofleet-sim-setup",
            "nemofleet-sim-fault", "nemofleet-sim-nvml-trap"} <= {f.name for f in (here / "sim").iterdir()}
    assert (here / "standin" / "vllm_standin.py").is_file() and (here / "hfmirror.py").is_file()
    # the stand-in image carries the installed nemofleet's flag table beside the stand-in
    assert images.VLLM_FLAGS == Path(vllm_flags.__file__).resolve() and images.VLLM_FLAGS.is_file()
    assert {"h200-1", "h100-1", "a100-1", "broken-1"} <= set(load_profiles("default"))
    # the scale testbed runs the repository's deploys and inventory from its root
    assert (scale.ROOT / "deploys" / "nemotron.py").is_file() and (scale.ROOT / "inventories" / "testbed.py").is_file()


def test_the_standin_runs_from_its_image_directory_with_the_flag_table_and_the_standard_library_only(tmp_path):
    """What images.standin_image copies into /opt/standin (the stand-in and nemofleet's vllm_flags.py)
    is all it needs: run it there with `python3 -I` (no site-packages, no nemofleet)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import nemofleet_testbed
    from nemofleet_testbed import images

    opt = tmp_path / "opt" / "standin"
    opt.mkdir(parents=True)
    shutil.copy(Path(nemofleet_testbed.__file__).parent / "standin" / "vllm_standin.py", opt / "vllm_standin.py")
    shutil.copy(images.VLLM_FLAGS, opt / "vllm_flags.py")
    r = subprocess.run([sys.executable, "-I", str(opt / "vllm_standin.py"), "serve", "--help"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0 and "--max-model-len" in r.stdout, r.stdout + r.stderr


def test_the_testbed_wheel_carries_every_file_the_images_and_profiles_read():
    """testbed/pyproject.toml's package data names every non-Python file of the package (a
    non-editable install of nemofleet-testbed builds the same images)."""
    import tomllib
    from pathlib import Path

    import nemofleet_testbed

    root = Path(nemofleet_testbed.__file__).resolve().parent
    meta = tomllib.loads((root.parents[1] / "pyproject.toml").read_text())
    globs = meta["tool"]["setuptools"]["package-data"]["nemofleet_testbed"]
    # the modules (Python files at the top) travel anyway; files in sim/, standin/, profiles/ are data
    files = {f.relative_to(root) for f in root.rglob("*")
             if f.is_file() and not (f.parent == root and f.suffix == ".py") and "__pycache__" not in f.parts}
    assert Path("standin/vllm_standin.py") in files
    uncovered = sorted(str(f) for f in files if not any(f.match(g) for g in globs))
    assert files and uncovered == [], uncovered
    assert {d.split(">")[0].split("=")[0] for d in meta["project"]["dependencies"]} == {"nemofleet", "pyyaml"}


def test_nemofleet_testbed_hands_its_arguments_to_the_testbed_package(monkeypatch, capsys):
    from nemofleet import cli
    from nemofleet_testbed import cli as tbcli

    seen = []
    monkeypatch.setattr(tbcli, "_run", lambda a: seen.append((a.action, a.hosts, a.profile)) or 0)
    assert cli.main(["testbed", "down"]) == 0
    assert cli.main(["testbed", "status", "--profile", "x.yaml"]) == 0
    assert seen == [("down", [], "default"), ("status", [], "x.yaml")]


def test_testbed_up_without_an_engine_answers_at_once_before_any_build(tmp_path):
    """No Docker engine answering: one sentence within seconds, before debootstrap or any build
    (the engine is the first thing checked), and nothing written to the testbed's directory."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent", NEMOFLEET_TESTBED_DIR=str(tmp_path / "tb"))
    t0 = time.monotonic()
    r = subprocess.run([str(Path(sys.executable).with_name("nemofleet")), "testbed", "up"], capture_output=True,
                       text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    assert r.returncode != 0 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "unix:///nonexistent" in lines[0] and "Docker engine" in lines[0], r.stderr
    assert took < 5, f"took {took:.1f} s"
    assert not (tmp_path / "tb").exists()
