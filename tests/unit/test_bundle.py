"""nemofleet bundle: a small synthetic bundle, signed and verified with the real ssh-keygen."""
from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from nemofleet import bundle, cli


@pytest.fixture()
def made(tmp_path):
    """(bundle path, allowed signers, other signers) of a bundle with an image, weights and a package."""
    keys = {}
    for who in ("ops", "stranger"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(tmp_path / who)], check=True)
        pub = (tmp_path / f"{who}.pub").read_text().split()
        keys[who] = tmp_path / f"{who}.signers"
        keys[who].write_text(f'{who}@fleet namespaces="{bundle.NAMESPACE}" {pub[0]} {pub[1]}\n')
    parts = tmp_path / "parts"
    files = {"images/abc.tar": (b"image bytes" * 100, {"purpose": "image", "image": "vllm/vllm-openai:v0.11.0"}),
             "weights/m@1/config.json": (b"{}", {"purpose": "weights", "repo": "org/m", "revision": "1" * 40}),
             "debs/haproxy_2.6_amd64.deb": (b"deb", {"purpose": "package", "package": "haproxy"})}
    manifest = {"format": bundle.FORMAT, "created": "2026-12-07T00:00:00Z", "inventory": "t.py",
                "plans": {"h1": {"model": "org/m@" + "1" * 40, "image": "vllm/vllm-openai:v0.11.0", "vllm": "0.11.0",
                                 "gpu": "H100 80 GiB"}}, "parts": []}
    for name, (data, meta) in files.items():
        (parts / name).parent.mkdir(parents=True, exist_ok=True)
        (parts / name).write_bytes(data)
        import hashlib
        manifest["parts"].append({"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                  **meta, "serves": ["h1"]})
    out = tmp_path / "b.bundle"
    lines = []
    bundle.write(str(out), manifest, str(parts), str(tmp_path / "ops"), say=lines.append)
    assert lines and lines[0].startswith(f"writing {out}: ")  # the size, before anything is written
    return out, keys["ops"], keys["stranger"]


def flip(path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_good_bundle_verifies_and_shows(made):
    out, ok, _ = made
    b = bundle.Bundle(str(out))
    assert b.check_signature(str(ok)) == "ops@fleet"
    seen = []
    b.check_parts(say=seen.append)
    assert len(seen) == 3
    text = "\n".join(bundle.show(b))
    assert "host h1: org/m@" in text and "haproxy" in text and "vLLM 0.11.0" in text
    with b.part("images/abc.tar") as f:  # a part reads as a file of its own bytes
        assert f.read() == b"image bytes" * 100
        f.seek(0)
        assert f.read(5) == b"image"


def test_a_flipped_byte_in_a_part_is_one_sentence(made, capsys):
    out, ok, _ = made
    b = bundle.Bundle(str(out))
    flip(out, b.members["weights/m@1/config.json"][0])
    assert cli.main(["bundle", "verify", str(out), "--allowed-signers", str(ok)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "weights/m@1/config.json does not match its SHA-256" in err


def test_an_unknown_signer_and_a_changed_manifest_are_refused(made, capsys):
    out, ok, stranger = made
    assert cli.main(["bundle", "verify", str(out), "--allowed-signers", str(stranger)]) == 1
    assert "signed by a key that" in capsys.readouterr().err
    b = bundle.Bundle(str(out))
    at = b.members["manifest.json"][0] + b.manifest_bytes.index(b'"h1"') + 2  # the host's name, same length
    flip(out, at)
    assert cli.main(["bundle", "verify", str(out), "--allowed-signers", str(ok)]) == 1
    assert "does not match its signature" in capsys.readouterr().err


def test_show_and_not_a_bundle(made, tmp_path, capsys):
    out, _, _ = made
    assert cli.main(["bundle", "show", str(out)]) == 0
    assert "3 parts" in capsys.readouterr().out
    junk = tmp_path / "junk"
    junk.write_bytes(b"x" * 2000)
    assert cli.main(["bundle", "show", str(junk)]) == 1
    assert "is not a nemofleet bundle" in capsys.readouterr().err


def test_a_host_needing_a_part_the_bundle_lacks_is_refused_naming_it(made):
    out, _, _ = made
    b = bundle.Bundle(str(out))
    s = SimpleNamespace(install_nvidia_driver=False, install_container_toolkit=False, container_toolkit_version=None)
    d = SimpleNamespace(repo="org/m", revision="1" * 40, directory="/srv/m@1")
    want = SimpleNamespace(image="vllm/vllm-openai:v0.11.0", downloads=[d], front_door=True)
    assert bundle.refusals(b, want, s) == []
    want.downloads = [SimpleNamespace(repo="org/other", revision="2" * 40, directory="/srv/o")]
    [why] = bundle.refusals(b, want, s)
    assert "lacks the weights org/other@222222222222" in why
    assert "install_nvidia_driver" in bundle.refusals(b, want, SimpleNamespace(install_nvidia_driver=True))[0]


@pytest.fixture()
def mirror(tmp_path):
    """The testbed's Hub mirror (stdlib) on 127.0.0.1 with its tiny checkpoint: (endpoint, repo, commit, log)."""
    import threading
    from http.server import ThreadingHTTPServer

    from nemofleet_testbed import hfmirror, tinymodel

    repo = "nvidia/Tiny"
    sha = tinymodel.build(str(tmp_path / "repos"), repo, shard_bytes=4096)
    log = tmp_path / "requests.log"
    handler = type("H", (hfmirror.Handler,), {"root": str(tmp_path / "repos"), "log_path": str(log)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", repo, sha, log
    server.shutdown()


def test_weights_are_fetched_verified_with_their_metadata_and_resumed(mirror, tmp_path):
    from nemofleet.fleet import bundle as create

    endpoint, repo, sha, log = mirror
    lines = []
    stage = create._Stage(str(tmp_path / "b.bundle"), lines.append)
    create._weights(stage, endpoint, repo, sha, f"/srv/models/nvidia--Tiny@{sha[:12]}", {"h1"})
    shard = f"weights/nvidia--Tiny@{sha[:12]}/model-00001-of-00002.safetensors"
    meta = f"weights/nvidia--Tiny@{sha[:12]}/.cache/huggingface/download/model-00001-of-00002.safetensors.metadata"
    assert stage.parts[shard]["serves"] == ["h1"] and stage.parts[shard]["revision"] == sha
    commit, etag = open(stage.path(meta)).read().splitlines()[:2]
    assert commit == sha and etag == stage.parts[shard]["sha256"]  # the LFS etag is the file's SHA-256
    gets = [line for line in log.read_text().splitlines() if "/resolve/" in line]
    assert len(gets) == 7
    again = create._Stage(str(tmp_path / "b.bundle"), lines.append)  # a re-run after an interruption
    create._weights(again, endpoint, repo, sha, f"/srv/models/nvidia--Tiny@{sha[:12]}", {"h2"})
    assert [line for line in log.read_text().splitlines() if "/resolve/" in line] == gets  # nothing fetched again
    assert sum("already here (resumed)" in line for line in lines) == 7
    with pytest.raises(bundle.BundleError, match="could not fetch"):
        create._weights(again, endpoint, repo, "f" * 40, "/srv/models/x", {"h1"})


def test_an_image_archive_is_identified_by_its_image_id_and_must_hold_the_tag(tmp_path):
    import io
    import tarfile

    from nemofleet.fleet import bundle as create

    archive = tmp_path / "img.tar"
    with tarfile.open(archive, "w") as t:
        data = json.dumps([{"Config": "blobs/sha256/" + "c" * 64, "RepoTags": ["vllm/vllm-openai:v1"]}]).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    stage = create._Stage(str(tmp_path / "b.bundle"), lambda line: None)
    create._image(stage, "vllm/vllm-openai:v1", str(archive), {"h1"})
    [part] = stage.parts.values()
    assert part["image_id"] == "sha256:" + "c" * 64 and part["path"] == "images/" + "c" * 16 + ".tar"
    with pytest.raises(bundle.BundleError, match="does not hold vllm/vllm-openai:v2"):
        create._image(stage, "vllm/vllm-openai:v2", str(archive), {"h1"})


def _tar(path, manifest, extra=()) -> str:
    """A file shaped like a bundle (a manifest, a signature, parts) whose manifest is `manifest`."""
    import io
    import tarfile

    with tarfile.open(path, "w") as t:
        raw = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
        for name, data in [("manifest.json", raw), ("manifest.json.sig", b"sig"), *extra]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return str(path)


HEX = "0" * 64
GOOD_PART = {"path": "images/a.tar", "size": 3, "sha256": HEX, "purpose": "image", "serves": ["h"]}


@pytest.mark.parametrize("manifest, said", [
    ({"parts": [{"path": "x"}]}, "created and inventory must be text"),
    ({"created": 1, "inventory": "i", "parts": []}, "created and inventory must be text"),
    ({"created": "t", "inventory": "i", "plans": {"h": 5}, "parts": []}, "plans must map host names"),
    ({"created": "t", "inventory": "i", "parts": "zz"}, "parts must be a list"),
    ({"created": "t", "inventory": "i", "parts": [7]}, "a part is int"),
    ({"created": "t", "inventory": "i", "parts": [{**GOOD_PART, "path": ["x"]}]}, "not a plain relative name"),
    ({"created": "t", "inventory": "i", "parts": [{**GOOD_PART, "path": "../x"}]}, "not a plain relative name"),
    ({"created": "t", "inventory": "i", "parts": [{**GOOD_PART, "path": "/etc/x"}]}, "not a plain relative name"),
    ({"created": "t", "inventory": "i", "parts": [GOOD_PART, GOOD_PART]}, "listed once"),
    ({"created": "t", "inventory": "i", "parts": [{**GOOD_PART, "size": "3"}]}, "not a count of bytes"),
    ({"created": "t", "inventory": "i", "parts": [{**GOOD_PART, "size": True}]}, "not a count of bytes"),
    ({"created": "t", "inventory": "i", "parts": [{**GOOD_PART, "sha256": 5}]}, "no SHA-256 of 64 hex digits"),
    ({"created": "t", "inventory": "i", "parts": [{**GOOD_PART, "purpose": None}]}, "not text"),
    ({"created": "t", "inventory": "i", "parts": [{**GOOD_PART, "revision": ["x"]}]}, "not text"),
    ({"created": "t", "inventory": "i", "parts": [{**GOOD_PART, "serves": 3}]}, "serves must list host names"),
])
@pytest.mark.parametrize("action", ["show", "verify"])
def test_a_manifest_of_another_shape_is_one_sentence_before_any_trust(tmp_path, capsys, manifest, said, action):
    """show reads the manifest before any signature is checked, verify before it checks one: a
    hostile manifest is refused in one sentence (exit 1), never an unexpected error."""
    path = _tar(tmp_path / "b.bundle", {"format": bundle.FORMAT, **manifest})
    argv = ["bundle", action, path] + (["--allowed-signers", str(tmp_path / "none")] if action == "verify" else [])
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert said in err and "unexpected" not in err and err.count("\n") == 1, err


def test_show_of_an_unsigned_manifest_escapes_what_it_prints(tmp_path, capsys):
    """Text read from the manifest reaches the terminal escaped (show runs before anyone trusts it)."""
    manifest = {"format": bundle.FORMAT, "created": "\x1b[31m\u2028", "inventory": None,
                "plans": {"h\x1b]0;t\x07": {"model": "m\x1b[2J"}}, "parts": [{**GOOD_PART, "revision": None}]}
    assert cli.main(["bundle", "show", _tar(tmp_path / "b.bundle", manifest, [("images/a.tar", b"abc")])]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u2028" not in out and "\x07" not in out, out
