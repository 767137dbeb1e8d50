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
