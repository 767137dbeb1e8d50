"""The weights fan-out decision (fanout.py): one origin fetch per (repo, revision), every other
host copies from a verified holder, holders double each step, sources named with spares."""

import math

from nemofleet import fanout
from nemofleet.desired import seed_sources
from nemofleet import settings as settings_mod
from nemofleet.operations.weights import seed_lines

K = ("nvidia/M", "a" * 40)
K2 = ("nvidia/N", "b" * 40)
KEYS = {"weights_seed_key": "-----BEGIN X-----\nk\n-----END X-----", "weights_seed_public_key": "ssh-ed25519 AAAA"}


def hosts(n):
    return [f"h{i}" for i in range(1, n + 1)]


def test_one_origin_fetch_then_log2_steps():
    for n in (1, 2, 4, 8, 20, 100):
        hs = hosts(n)
        f = fanout.decide([hs], {h: K for h in hs}, {})
        origin = [c for c in f.copies.values() if not c.sources]
        assert [c.host for c in origin] == ["h1"]
        assert len(f.copies) == n
        steps = f.steps(hs)
        assert len(steps) == 1 + math.ceil(math.log2(n))  # the origin fetch, then holders double
        assert sum(map(len, steps)) == n


def test_every_source_holds_before_its_step_and_seeds_one_host_per_step():
    hs = hosts(13)
    f = fanout.decide([hs], {h: K for h in hs}, {})
    step_of = {h: f.copies[h].step for h in hs}
    per_step: dict = {}
    for c in f.copies.values():
        for s in c.sources:
            assert step_of[s] < c.step  # every source is verified before the copy starts
        if c.sources:
            per_step.setdefault((c.step, c.sources[0]), []).append(c.host)
    assert all(len(v) == 1 for v in per_step.values())
    assert all(1 <= len(c.sources) <= 1 + fanout.SPARE_SOURCES for c in f.copies.values() if c.step > 1)


def test_existing_holders_seed_from_the_first_step_and_nobody_fetches():
    hs = hosts(5)
    f = fanout.decide([hs[1:]], {h: K for h in hs}, {"h1": {K}, "other": {K}})
    assert all(c.sources for c in f.copies.values())
    assert {c.sources[0] for c in f.copies.values() if c.step == 0} == {"h1", "other"}
    assert "h1" not in f.copies  # it holds the key already


def test_canary_fetches_and_later_batches_copy():
    hs = hosts(7)
    f = fanout.decide([hs[:1], hs[1:3], hs[3:]], {h: K for h in hs}, {})
    assert f.copies["h1"].sources == ()
    assert all(f.copies[h].sources for h in hs[1:])
    assert f.copies["h2"].sources[0] == "h1" and f.copies["h2"].step == 0
    # the third batch starts with h1..h3 as holders: 3 copies in its first step, 1 in its second
    assert [len(s) for s in f.steps(hs[3:])] == [3, 1]


def test_two_models_fan_out_apart_and_bystanders_go_first():
    hs = hosts(6)
    wants = {"h1": K, "h2": K2, "h3": K, "h4": K2, "h5": None}
    f = fanout.decide([hs], wants, {})
    assert {c.host for c in f.copies.values() if not c.sources} == {"h1", "h2"}
    assert f.copies["h3"].sources[0] == "h1" and f.copies["h4"].sources[0] == "h2"
    assert f.steps(hs) == [["h1", "h2", "h5", "h6"], ["h3", "h4"]]
    assert "h3: copies nvidia/M@aaaaaaaaaaaa from h1, then the origin (step 1)" in f.lines()


def test_seed_from_names_peers_as_they_reach_each_other():
    hs = hosts(4)
    f = fanout.decide([hs], {h: K for h in hs}, {})
    assert f.seed_from("h1", {}) is None
    assert f.seed_from("h4", {"h2": "10.0.0.2"}) == [{"host": "10.0.0.2", "wait": 600},  # its source,
                                                      {"host": "h1", "wait": 600}]  # then a spare
    peers = f.seed_from("h3", {"h1": "nf-h1"}, wait=30)
    assert peers == [{"host": "nf-h1", "wait": 30}, {"host": "h2", "wait": 30}]
    assert settings_mod._check(settings_mod.BY_NAME["weights_seed_from"], peers) is None


def test_who_takes_part():
    data = {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": "c" * 40}}
    key = fanout.wanted(data, KEYS)
    assert key is not None and key[1] == "c" * 40
    assert fanout.wanted(data, {}) is None  # no fleet seed key: no fan-out
    assert fanout.wanted({**data, "weights_fanout": False}, KEYS) is None
    assert fanout.wanted({**data, "weights_seed_from": "peer"}, KEYS) is None  # the operator's choice wins
    assert fanout.wanted({**data, "port_base": "x"}, KEYS) is None
    assert fanout.weights_dir(data, key).startswith("/srv/nemofleet/models/")


def test_holders_read_without_python():
    dirs = {"/m/a@1": "1" * 40}
    script = fanout.holders_script(dirs)
    assert "python" not in script and "grep -qs" in script
    assert fanout.parse_holders(["nemofleet-holds /m/a@1", "nemofleet-holds /x", "junk"], {"/m/a@1": K}) == {K}


def test_settings_and_the_seed_list_reach_rsync_with_the_bound():
    s = settings_mod.parse({"weights_seed_from": ["a", {"host": "b", "port": 2222}], "weights_peer_bwlimit": "200M"})
    seed = seed_sources(s)
    assert [x["host"] for x in seed] == ["a", "b"] and all(x["bwlimit"] == "200M" for x in seed)
    lines = seed_lines(seed, "/srv/nemofleet/models/m@c", "c" * 40)
    assert len(lines) == 7 and "root@a:m@c/" in lines[1] and "root@b:m@c/" in lines[4]
    assert "os.unlink" in lines[6]  # no peer had it: half-written files are removed before hf download
    assert "--bwlimit=200M" in lines[1] and "-p 2222" in lines[4] and "list-only" not in " ".join(lines)
    waiting = seed_lines([{"host": "a", "wait": 30, "root": "/srv/nemofleet/models"}], "/srv/nemofleet/models/m@c", "c" * 40)
    assert "rsync --timeout=60 --list-only" in waiting[0] and "root@a:m@c/.nemofleet-complete" in waiting[0] and "-ge 30 ]" in waiting[0]
    single = seed_sources(settings_mod.parse({"weights_seed_from": "a"}))
    assert isinstance(single, dict) and "bwlimit" not in single  # one peer: as before
    for bad in ([], ["a"] * 9, ["bad host"], 5, [{"host": "a", "wait": 5}], {"host": "a", "wait": True}):
        try:
            settings_mod.parse({"weights_seed_from": bad})
            raise AssertionError(bad)
        except settings_mod.SettingsError as exc:
            assert len(exc.problems) == 1
    for bad in ("0", "fast", -1):
        try:
            settings_mod.parse({"weights_peer_bwlimit": bad})
            raise AssertionError(bad)
        except settings_mod.SettingsError:
            pass


def test_plan_shows_who_seeds_whom_and_each_host_says_its_sources(tmp_path, capsys):
    import json

    from nemofleet import cli
    from nemofleet.models import host_dir_name
    from test_desired import REV, facts

    pub = tmp_path / "seed.pub"
    pub.write_text("ssh-ed25519 AAAAC3NzaFLEET nemofleet-weights-seed\n")
    model = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV}
    data = {"vllm_api_key": "sk-nf-" + "a" * 32, "model": model, "weights_seed_key": KEYS["weights_seed_key"],
            "weights_seed_public_key_file": str(pub)}
    names = ["h200-1", "h200-2", "h200-3"]
    inv = tmp_path / f"inv_fan_{tmp_path.name.replace('-', '_')}.py"
    inv.write_text(f"gpu_h200 = {[(n, dict(data, weights_peer_address=f'10.0.0.{k}')) for k, n in enumerate(names, 1)]!r}\n")
    f = {n: facts() for n in names}
    key = fanout.wanted(data, {**KEYS})
    f["h200-2"]["models"] = {host_dir_name(*key): {"complete": True, "revision": key[1]}}  # h200-2 holds it
    (tmp_path / "facts.json").write_text(json.dumps(f))
    assert cli.main(["plan", str(inv), "--facts", str(tmp_path / "facts.json")]) == 0
    out = capsys.readouterr().out
    assert "== weights fan-out" in out and "fetches" not in out  # a holder seeds: no origin fetch
    assert f"h200-1: copies {key[0]}@{key[1][:12]} from h200-2, then the origin (step 0)" in out
    assert "weights: copied from 10.0.0.2 (rsync over SSH, verified here), then the mirror" in out
