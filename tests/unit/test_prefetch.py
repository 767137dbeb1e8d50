"""facts/prefetch.py: many facts in one remote command, answered exactly as each fact alone."""
import json
import subprocess
import types

from nemofleet.facts import prefetch
from nemofleet.facts.files import FilesDigest
from nemofleet.facts.units import UnitStates


def run(cmd: str) -> list[str]:
    return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30).stdout.splitlines()


def test_batch_answers_like_each_fact_alone(tmp_path):
    (tmp_path / "a").write_text("x")
    (tmp_path / "b").write_text("y")
    parts = ((f"{FilesDigest.__module__}.FilesDigest", json.dumps({"paths": [str(tmp_path / "a"), str(tmp_path / "c")]})),
             (f"{FilesDigest.__module__}.FilesDigest", json.dumps({"paths": [str(tmp_path / "b")]})),
             ("nemofleet.facts.units.UnitStates", json.dumps({"units": ["nemofleet-vllm-x.service"]})))
    sections = prefetch.Batch().process(run(prefetch.Batch().command(parts)))
    alone = FilesDigest().process(run(FilesDigest().command(paths=(str(tmp_path / "a"), str(tmp_path / "c")))))
    assert FilesDigest().process(sections[0]) == alone
    assert FilesDigest().process(sections[1]) == FilesDigest().process(run(FilesDigest().command(paths=(str(tmp_path / "b"),))))
    assert 2 in sections  # UnitStates ran too (no systemd here: its own default-ish answer)


def test_a_part_that_fails_is_left_to_its_operation():
    out = ["@@nemofleet-batch:0", "x", "@@nemofleet-rc:0", "@@nemofleet-batch:1", "boom", "@@nemofleet-rc:2"]
    assert prefetch.Batch().process(out) == {0: ["x"]}


def test_fact_answers_from_the_batch_and_falls_back_to_pyinfra(monkeypatch):
    asked = []
    fake = types.SimpleNamespace(name="h1", get_fact=lambda cls, **kw: asked.append((cls, kw)) or
                                 ({0: ["755 abc /p"]} if cls is prefetch.Batch else "live"))
    monkeypatch.setattr(prefetch, "current_host", fake)
    assert prefetch.load([(FilesDigest, {"paths": ("/p",)})]) == 1
    assert prefetch.fact(FilesDigest, paths=("/p",)) == FilesDigest().process(["755 abc /p"])
    assert [c for c, _ in asked] == [prefetch.Batch]  # answered from the one batch read
    assert prefetch.fact(UnitStates, units=("u",)) == "live"  # not read ahead: read now
    assert asked[-1] == (UnitStates, {"units": ("u",)})
    prefetch.forget()
    assert prefetch.fact(FilesDigest, paths=("/p",)) == "live"


def test_what_host_facts_read_is_not_read_again(monkeypatch):
    """daemon.json, the image and a verified weights marker, read by HostFacts, answer the batch's
    reads of the same run: on a converged host the batch no longer runs docker image inspect,
    cat daemon.json or a second python weights check."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from test_desired import CASES, SECRETS

    from nemofleet import deploy, desired
    from nemofleet.facts.docker import DaemonJson, ImageInfo
    from nemofleet.facts.host import known_reads
    from nemofleet.facts.weights import WeightsStatus

    f, data = CASES["h200-1x-cdi"]
    want = desired.build("h", data, f, SECRETS)
    wdir = want.downloads[0].directory
    f = dict(f, models={wdir.rsplit("/", 1)[-1]: {"complete": True, "revision": want.downloads[0].revision,
                                                  "marker_ok": {"present_bytes": 5, "total_size": 5}}})
    reads = known_reads(f, "/srv/nemofleet/models", want.image)
    batches = []
    fake = types.SimpleNamespace(name="h1", get_fact=lambda cls, **kw: batches.append(kw["parts"]) or {})
    monkeypatch.setattr(prefetch, "current_host", fake)
    prefetch.known(reads)
    prefetch.load(deploy.fact_reads(want))
    asked = " ".join(p for p, _ in batches[0])
    for cls in (DaemonJson, ImageInfo, WeightsStatus):
        assert cls.__name__ not in asked
    assert prefetch.fact(ImageInfo, ref=want.image) == f["image"]
    assert prefetch.fact(WeightsStatus, directory=wdir, revision=want.downloads[0].revision, full=False)["marker"]
    # a part HostFacts could not read is read again by its operation's batch
    prefetch.known(known_reads(dict(f, errors={"image": "timed out"}), "/srv/nemofleet/models", want.image))
    prefetch.load(deploy.fact_reads(want))
    assert "ImageInfo" in " ".join(p for p, _ in batches[1])


def test_models_on_disk_answers_the_weights_check_exactly(tmp_path):
    """ModelsOnDisk (in HostFacts) finds an intact marker as the weights check's fast path does,
    and answers the same value; a shard changed since is left to the check."""
    import os
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from test_weights_check import check, model

    from nemofleet.facts.weights import ModelsOnDisk, status_from_models

    d, sha = model(tmp_path)
    check(d, sha, "write")
    root, name = os.path.dirname(d), os.path.basename(d)
    on_disk = ModelsOnDisk().process(run(ModelsOnDisk().command(root=root)))
    kw, value = status_from_models(root, name, on_disk[name])
    assert kw == {"directory": d, "revision": sha, "full": False} and value == check(d, sha)[1]
    os.truncate(os.path.join(d, "model-00002-of-00002.safetensors"), 1000)
    on_disk = ModelsOnDisk().process(run(ModelsOnDisk().command(root=root)))
    assert status_from_models(root, name, on_disk[name]) is None and on_disk[name]["complete"]


def test_files_digest_reads_every_file_with_one_stat_and_one_sha256sum(tmp_path):
    import hashlib
    import os

    (tmp_path / "a b").write_text("x")
    (tmp_path / "c").write_text("yy")
    os.chmod(tmp_path / "c", 0o600)
    (tmp_path / "back\\slash").write_text("z")  # sha256sum escapes this name: its line starts with "\"
    (tmp_path / "d").mkdir()
    paths = tuple(str(tmp_path / n) for n in ("a b", "d", "nope", "c", "back\\slash"))
    cmd = FilesDigest().command(paths)
    assert cmd.count("sha256sum") == 1 and cmd.count("stat -c") == 2  # all files, and a directory's own
    got = FilesDigest().process(run(cmd))
    assert got == {paths[0]: ("644", hashlib.sha256(b"x").hexdigest()), paths[1]: ("755", "dir"), paths[2]: None,
                   paths[3]: ("600", hashlib.sha256(b"yy").hexdigest()),
                   paths[4]: ("644", hashlib.sha256(b"z").hexdigest())}
    # a file that vanished between the test and the read: never paired with another file's digest
    torn = ["@nemofleet-files", "/a", "/b", "@nemofleet-modes", "644", "@nemofleet-sums", "0" * 64 + "  /a"]
    assert FilesDigest().process(torn) == {"/a": None, "/b": None}
    assert FilesDigest().process(["755 abc /p"]) == {"/p": ("755", "abc")}  # a directory's or older line


def test_unit_states_are_one_systemctl_for_every_unit(tmp_path):
    import os

    cmd = UnitStates().command(("a.service", "b.service"))
    assert cmd.count("systemctl") == 1 and "timeout 60 systemctl show -p Id,UnitFileState,ActiveState" in cmd
    # systemctl show's blocks (its properties in its own order; no blank line after the last)
    fake = tmp_path / "systemctl"
    fake.write_text("#!/bin/sh\nprintf 'Id=a.service\\nActiveState=active\\nUnitFileState=enabled\\n\\n"
                    "Id=b.service\\nUnitFileState=\\nActiveState=inactive\\n'\n")
    fake.chmod(0o755)
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")).stdout.splitlines()
    assert out[:2] == ["unit a.service enabled active", "unit b.service - inactive"]
    assert UnitStates().process(out)["units"] == {"a.service": {"enabled": True, "active": True},
                                                  "b.service": {"enabled": False, "active": False}}
