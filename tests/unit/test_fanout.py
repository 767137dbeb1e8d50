"""The weights fan-out decision (fanout.py): one origin fetch per (repo, revision), every other
host copies from a verified holder, holders double each step, sources named with spares."""

import math

from nemofleet import fanout
from nemofleet.desired import seed_sources
from nemofleet import settings as settings_mod
from nemofleet.operations.weights import seed_lines

K = ("nvidia/M", "a" * 40)
K2 = ("nvidia/N", "b" * 40)
KEYS = {"weights_seed_key": "-----BEGIN X-----\nk\n-----END X-----", "weights_seed_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFy02I2mbKJF+J/uLS5Tm25gylWlotT5MStmUt3NAvDu fleet"}


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


def _spec(data, secrets=None, name="h", groups=()):
    """The host's spec as the edge reads it (spec.read), with these secrets (the fleet seed key)."""
    from dataclasses import replace

    from nemofleet import spec

    sp = spec.read(name, data, groups)
    return replace(sp, secrets=spec.typed_secrets(KEYS if secrets is None else secrets))


def _specs(datas, secrets=None, gateway=()):
    return {h: _spec(d, secrets, h, ("gateway",) if h in gateway else ()) for h, d in datas.items()}


def test_who_takes_part():
    data = {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": "c" * 40}}
    key = fanout.wanted(_spec(data))
    assert key is not None and key[1] == "c" * 40
    assert fanout.wanted(_spec(data, {})) is None  # no fleet seed key: no fan-out
    assert fanout.wanted(_spec({**data, "weights_fanout": False})) is None
    assert fanout.wanted(_spec({**data, "weights_seed_from": "peer"})) is None  # the operator's choice wins
    group = {**data, "serving_group": "g", "serving_group_members": ["a", "b"]}
    assert settings_mod.parse(group).serving_group == "g"  # it parses: left out for being a member
    assert fanout.wanted(_spec(group)) is None  # a multi-node group's members fetch as they would alone
    assert fanout.wanted(_spec({**data, "port_base": "x"})) is None
    assert fanout.weights_dir(_spec(data), key).startswith("/srv/nemofleet/models/")


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
    pub.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFy02I2mbKJF+J/uLS5Tm25gylWlotT5MStmUt3NAvDu nemofleet-weights-seed\n")
    model = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV}
    data = {"vllm_api_key": "sk-nf-" + "a" * 32, "model": model, "weights_seed_key": KEYS["weights_seed_key"],
            "weights_seed_public_key_file": str(pub)}
    names = ["h200-1", "h200-2", "h200-3"]
    inv = tmp_path / f"inv_fan_{tmp_path.name.replace('-', '_')}.py"
    inv.write_text(f"gpu_h200 = {[(n, dict(data, weights_peer_address=f'10.0.0.{k}')) for k, n in enumerate(names, 1)]!r}\n")
    f = {n: facts() for n in names}
    key = fanout.wanted(_spec(data))
    f["h200-2"]["models"] = {host_dir_name(*key): {"complete": True, "revision": key[1]}}  # h200-2 holds it
    (tmp_path / "facts.json").write_text(json.dumps(f))
    assert cli.main(["plan", str(inv), "--facts", str(tmp_path / "facts.json")]) == 0
    out = capsys.readouterr().out
    assert "== weights fan-out" in out and "fetches" not in out  # a holder seeds: no origin fetch
    assert f"h200-1: copies {key[0]}@{key[1][:12]} from h200-2, then the origin (step 0)" in out
    # the converge's first host asks the others of the run whether they hold it before the origin
    assert ("weights: copied from the first of 10.0.0.2, 10.0.0.3 that holds a verified copy now (rsync over SSH, "
            "verified here), else fetched from the mirror") in out


def _run_data(n, **extra):
    model = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": "c" * 40}
    return {f"h{i}": {"model": model, "weights_peer_address": f"nf-h{i}", **extra} for i in range(1, n + 1)}


def test_a_converge_decides_one_tree_from_the_hosts_data_alone():
    datas = _run_data(6)
    datas["h3"] = {**datas["h3"], "weights_fanout": False}  # fetches alone
    datas["h5"] = {**datas["h5"], "weights_seed_from": "elsewhere"}  # the operator's peer wins
    run = fanout.for_run(_specs(datas, gateway={"h6"}))
    assert set(run.fan.copies) == {"h1", "h2", "h4"}
    # the origin fetcher first asks the others of the run whether they hold it now (no waiting)
    assert run.seed_from("h1") == [{"host": "nf-h2", "held": True}, {"host": "nf-h4", "held": True}]
    # the others copy from a host of the tree, waited for while it fetches, skipped at once if it never begins
    assert run.seed_from("h2") == [{"host": "nf-h1", "wait": fanout.SOURCE_STALL, "start": fanout.SOURCE_START}]
    assert [p["host"] for p in run.seed_from("h4")] == ["nf-h1", "nf-h2"]
    for h in ("h3", "h5", "h6"):
        assert run.seed_from(h) is None
    for h in ("h1", "h2", "h4"):  # what a host is handed parses as its own setting would
        assert settings_mod.parse({**datas[h], "weights_seed_from": run.seed_from(h)}).weights_seed_from
    # one host alone, or no seed key: nothing changes
    assert fanout.for_run(_specs(_run_data(1))).seed_from("h1") is None
    assert fanout.for_run(_specs(_run_data(4), {})).seed_from("h2") is None
    # a host already holding it is named in the plan as the source it is
    assert run.lines({"h2": {run.fan.copies["h1"].key}}) == [
        f"h1: copies nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4@cccccccccccc from h2, then the origin "
        "(step 0) (it holds it now)",
        "h4: copies nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4@cccccccccccc from h1, then h2, then the "
        "origin (step 2)"]


def test_held_and_start_are_typed_and_exclusive():
    ok = [{"host": "a", "held": True}, {"host": "b", "wait": 600, "start": 60}]
    assert [p.as_dict() for p in settings_mod.parse({"weights_seed_from": ok}).weights_seed_from] == ok
    for bad in ([{"host": "a", "held": "yes"}], [{"host": "a", "held": True, "wait": 60}],
                [{"host": "a", "wait": 60, "start": 5}], [{"host": "a", "start": "60; rm -rf /"}]):
        try:
            settings_mod.parse({"weights_seed_from": bad})
            raise AssertionError(bad)
        except settings_mod.SettingsError as exc:
            assert len(exc.problems) == 1 and "weights_seed_from" in exc.problems[0]


def test_the_deploy_decides_the_run_once_for_every_host(tmp_path, monkeypatch):
    """deploy.run under real pyinfra: every host of the run reads the same specs and fan-out (one
    per State), from the hosts pyinfra connected to within --limit, in inventory order; the
    sources reach each host as its own weights_seed_from, never written into host data."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_host, ctx_state

    from nemofleet import deploy, spec

    monkeypatch.setattr(spec, "read_secrets", lambda d: spec.typed_secrets(KEYS))
    datas = _run_data(3)
    inventory = Inventory(([(h, d) for h, d in datas.items()], {}))
    state = State(inventory, Config())
    for h in inventory:
        state.activate_host(h)
    seen, runs = {}, set()
    with ctx_state.use(state):
        for h in inventory:
            with ctx_host.use(h):
                seen[h.name] = deploy.run().fanout.seed_from(h.name)
                runs.add(id(deploy.run()))
                assert "weights_seed_from" not in deploy.data()
    assert len(runs) == 1  # decided once for the run
    assert seen == {"h1": [{"host": "nf-h2", "held": True}, {"host": "nf-h3", "held": True}],
                    "h2": [{"host": "nf-h1", "wait": 600, "start": 60}],
                    "h3": [{"host": "nf-h1", "wait": 600, "start": 60}, {"host": "nf-h2", "wait": 600, "start": 60}]}
    # --limit h2: a run of one host, as in a rollout's own deploy of each host
    limited = State(inventory, Config())
    for h in inventory:
        limited.activate_host(h)
    limited.limit_hosts = [inventory.get_host("h2")]
    with ctx_state.use(limited), ctx_host.use(inventory.get_host("h2")):
        assert deploy.run().fanout.seed_from("h2") is None


def test_peers_are_reached_where_the_controller_reaches_them_unless_told():
    from nemofleet.spec import peer_address

    assert peer_address("gpu-7", {"weights_peer_address": "10.1.0.7", "ssh_hostname": "1.2.3.4"}) == "10.1.0.7"
    assert peer_address("gpu-7", {"ssh_hostname": "10.0.0.7"}) == "10.0.0.7"  # an inventory alias
    for odd in ("127.0.0.1", "localhost", "::1", "a b", "$(reboot)", 7, None):
        assert peer_address("gpu-7", {"ssh_hostname": odd}) == "gpu-7"
    run = fanout.for_run(_specs({h: {**d, "ssh_hostname": f"10.0.0.{h[1:]}", "weights_peer_address": None}
                                 for h, d in _run_data(2).items()}))
    assert run.seed_from("h2") == [{"host": "10.0.0.1", "wait": fanout.SOURCE_STALL, "start": fanout.SOURCE_START}]
