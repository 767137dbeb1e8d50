"""Quote at one boundary: what the deploy would run is rendered and run (with stub tools) to
show hostile values and names read from disk are inert.

The values here bypass the settings schema on purpose (it refuses most of them): the quoting must
hold on its own."""
import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from nemofleet import desired, factmodel, paths, render, settings, shell
from nemofleet.operations import atomic_put, weights
from opharness import readable
from test_desired import REV, SECRETS, facts

HOSTILE_NAMES = ["$(touch {pwned})", "`touch {pwned}`", "x; touch {pwned}", "*", "a b", "a'b", "-rf", "..",
                 "nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4@$(touch {pwned})",
                 "nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4@0123456789ab; touch {pwned}",
                 "nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4@*"]
OLD = "nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4@aaaaaaaaaaaa"


def stubs(tmp: Path, **scripts: str) -> dict:
    """An environment whose PATH finds `name` as a shell script `body` first."""
    d = tmp / "stubs"
    d.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (d / name).write_text("#!/bin/sh\n" + body + "\n")
        (d / name).chmod(0o755)
    return dict(os.environ, PATH=f"{d}:{os.environ['PATH']}")


def test_prune_names_only_our_own_directories_and_runs_inert(tmp_path):
    root = tmp_path / "models"
    pwned = root / "PWNED"  # relative in the names: a directory name holds no `/`
    names = [n.format(pwned="PWNED") for n in HOSTILE_NAMES] + [OLD]
    root.mkdir()
    for n in names:
        if n != "..":
            (root / n).mkdir()
    on_disk = {n: {"complete": True, "revision": None} for n in names}
    d = desired.build("h", {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV},
                            "models_root": str(root)}, dict(facts(), models=on_disk), SECRETS)
    assert d.ok, d.refusals
    assert d.prune == [f"{root}/{OLD}"]
    # run what the operation yields, in the models root (a `*` would match everything there)
    cmds = [readable(c) for c in weights.pruned._inner(directories=d.prune)]
    for c in cmds:
        r = subprocess.run(["sh", "-c", c], cwd=root, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
    left = sorted(p.name for p in root.iterdir())
    assert OLD not in left and len(left) == len([n for n in names if n != OLD and n != ".."])
    assert not pwned.exists()


@pytest.mark.parametrize("word", ["/x; touch {pwned}", "a b", "$(touch {pwned})", "*", "-rf"])
def test_prune_quotes_even_a_path_it_was_given(tmp_path, word):
    pwned = tmp_path / "pwned"
    (tmp_path / "keep").mkdir()
    cmds = [readable(c) for c in weights.pruned._inner(directories=[str(tmp_path / word.format(pwned=pwned))])]
    r = subprocess.run(["sh", "-c", cmds[0]], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and not pwned.exists() and (tmp_path / "keep").exists()


def test_ready_wait_passes_the_address_as_one_argument(tmp_path, monkeypatch):
    pwned = tmp_path / "pwned"
    d = desired.build("h", {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV}}, facts(), SECRETS)
    hostile = f"::1%$(touch {pwned})`touch {pwned}`"
    monkeypatch.setattr(render, "probe_address", lambda p: f"[{hostile}]")
    cmd = desired.ready_command(d.plan, 5)
    log = tmp_path / "curl.args"
    env = stubs(tmp_path, curl=f'printf "%s\\n" "$@" >> {log}; printf 200')
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    assert f"http://[{hostile}]:8000/health" in log.read_text().splitlines()
    assert not pwned.exists()


def test_ready_wait_timeout_is_a_number_and_the_message_prints(tmp_path):
    d = desired.build("h", {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV}}, facts(), SECRETS)
    cmd = desired.ready_command(d.plan, 0)
    env = stubs(tmp_path, curl="printf 503", journalctl="echo journal", sleep="exit 0")
    r = subprocess.run(["bash", "-c", cmd + " sleep 1"], capture_output=True, text=True, env=env, timeout=30)
    assert "instance nemotron-0 not ready after 0s:" in r.stderr


@pytest.mark.parametrize("repo", ["a/b'c", "a/b'; touch {pwned}; '", "a/$(touch {pwned})"])
def test_download_failure_message_is_inert(tmp_path, repo):
    """The download script as the operation runs it, with the host's tools stubbed: the failure
    sentence carries the value as text (it used to sit inside `echo '...'`)."""
    pwned = tmp_path / "pwned"
    repo = repo.format(pwned=pwned)
    target = tmp_path / "w"
    script = weights.download_script(repo, "main", str(target), "img", None, None, [], [], 0)
    env = stubs(tmp_path, systemctl="exit 3", python3="exit 0", journalctl="exit 0", **{"systemd-run": "exit 1"})
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1
    assert f"hf download of {repo}@main failed (log above)" in r.stderr
    assert not pwned.exists()


def test_a_stalled_download_is_stopped(tmp_path):
    """stall_guard stops a unit whose directory stops growing, and reports it."""
    target = tmp_path / "w"
    target.mkdir()
    state = tmp_path / "active"
    state.write_text("")
    env = stubs(tmp_path, systemctl=f'case "$1" in is-active) [ -e {state} ];; stop) rm -f {state};; esac',
                sleep="exit 0")
    r = subprocess.run(["bash", "-c", weights.STALL_GUARD + "; " + shell.join(["stall_guard", "u", target, 45])
                        + "; echo rc=$?"], capture_output=True, text=True, env=env, timeout=60)
    assert "rc=1" in r.stdout and not state.exists()


@pytest.mark.parametrize("mode, private", [("0600", True), ("0400", True), ("0644", False), ("0755", False)])
def test_a_private_file_is_created_0600_before_its_content_arrives(mode, private):
    cmds = [readable(c) for c in atomic_put("secret", "/etc/nemofleet/x", mode)]
    upload = next(i for i, c in enumerate(cmds) if isinstance(c, list) and c[0] == "upload")
    created = any("umask 077" in str(c) and ": > /etc/nemofleet/.x.nemofleet-tmp" in str(c) for c in cmds[:upload])
    assert created == private


def test_shell_say_prints_any_text_as_it_is(tmp_path):
    text = "it's 100% $(id) `id` \\n done"
    r = subprocess.run(["sh", "-c", shell.say(text, err=False)], capture_output=True, text=True, timeout=10)
    assert r.stdout == text + "\n"
    r = subprocess.run(["sh", "-c", f"false || {shell.fail(text)}"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 1 and r.stderr == text + "\n"


def test_drain_restart_commands_are_joined_once():
    d = desired.build("h", {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV},
                            "tensor_parallel_size": 1}, facts(gpus=2), SECRETS)
    assert d.drain_restarts
    for _, _, c in d.drain_restarts:
        subprocess.run(["bash", "-n", "-c", c], check=True, timeout=10)


# ---------------------------------------------------------------------------- unit files, HAProxy, cron


@pytest.mark.parametrize("word", ["a\nExecStartPre=/bin/touch /tmp/x", "a\n", "tab\there", "a\rb", "\x1b[0m"])
def test_a_unit_argument_is_one_word_on_one_line(word, tmp_path):
    from test_destinations import verify_units

    quoted = render.systemd_word(word)
    assert "\n" not in quoted and "\r" not in quoted and quoted.startswith("'")
    d = desired.build("h", {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV}}, facts(), SECRETS)
    inst = dataclasses.replace(d.plan.instances[0], args=[*d.plan.instances[0].args, "--x", word])
    unit = render.unit(d.plan, inst, [], 29)
    assert not any(line.startswith("ExecStartPre=/bin/touch") for line in unit.splitlines())
    verify_units({"/etc/systemd/system/nemofleet-vllm-x.service": unit}, tmp_path)


def test_haproxy_lines_written_through_their_own_escaping():
    d = desired.build("h", {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV},
                            "tensor_parallel_size": 1}, facts(gpus=2), SECRETS)
    plan = dataclasses.replace(d.plan, host="h\nserver evil 10.6.6.6:80\n")
    cfg = render.front_door_config(plan, d.settings, None)
    assert not any(line.lstrip().startswith("server evil") for line in cfg.splitlines())
    for bad in ("a b", "a\nb", "x;y", ""):
        with pytest.raises(ValueError):
            render.haproxy_config([], "f", [bad], [], 30, 2, 1)
        with pytest.raises(ValueError):
            render.haproxy_config([], "f", ["127.0.0.1:1"], [(bad, "127.0.0.1:2")], 30, 2, 1)


def test_cron_line_refuses_a_schedule_cron_would_not_run():
    from test_destinations import cron_lines

    assert len(cron_lines(render.health_cron(settings.parse({"health_schedule": "*/5 * * * *"})))) == 1
    for bad in ("* * * * *\n* * * * * root id", "99 99 99 99 99", "*/0 * * * *"):
        with pytest.raises(ValueError):
            # past the settings (replace() takes typed values unchecked): the renderer refuses on its own
            render.health_cron(settings.defaults().replace(health_schedule=bad))


# ---------------------------------------------------------------------------- bounded


def test_every_command_that_reads_the_models_root_is_bounded():
    from nemofleet.facts.host import FreeDisk
    from nemofleet.facts.weights import ModelsOnDisk, WeightsStatus, check_command

    for c in (FreeDisk().command("/srv/m"), ModelsOnDisk().command("/srv/m"),
              WeightsStatus().command("/srv/m/x", REV), WeightsStatus().command("/srv/m/x", REV, full=True),
              check_command("/srv/m/x", REV, "write")):
        assert c.startswith("timeout "), c



def test_rollback_guard_prints_the_expected_release_as_text(tmp_path, monkeypatch):
    from nemofleet import hostcmd as commands

    pwned = tmp_path / "pwned"
    expect = f"x\"; touch {pwned}; echo \"$(touch {pwned})"
    kept = tmp_path / "previous"
    kept.mkdir()
    (kept / "release").write_text("id=other-release\n")
    monkeypatch.setattr(paths, "PREVIOUS", str(kept))  # the kept release's path is an argument of the program
    script = commands.rollback(expect=expect)
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and f"the kept release is other-release, not {expect}: not rolling back" in r.stderr
    assert not pwned.exists()


def test_haproxy_refusal_prints_a_host_name_with_percent_and_quotes_as_text(tmp_path):
    import json as _json

    from nemofleet.operations import frontdoor
    from opharness import run

    fixture = _json.loads((Path(__file__).parents[1] / "operations" / "frontdoor.configured"
                           / "refused_config_never_goes_live.json").read_text())
    name = "h%s%n'$(touch PWNED)"
    res = run(frontdoor.configured, fixture["kwargs"], fixture["facts"], host_name=name)
    script = next(c for c in res.commands if isinstance(c, list) and c[0] == "sh -c")[1]
    tmp = "/etc/haproxy/.haproxy.cfg.nemofleet-tmp"
    script = script.replace(tmp, str(tmp_path / "cfg.tmp")).split("chmod")[0] + "exit 0"
    env = stubs(tmp_path, haproxy="echo '[ALERT] bad line 3'; exit 1")
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=30)
    assert r.returncode == 1 and f"of {name} fails haproxy -c ([ALERT] bad line 3)" in r.stderr, r.stderr
    assert not (tmp_path / "PWNED").exists()


def test_link_source_is_one_of_our_own_directories():
    repo = "nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"
    def typed(dirs):  # the models part as the edge types it (factmodel.Facts.models); names are kept as read
        return factmodel.parse({"models": dirs})[0].models

    on_disk = typed({f"{repo}@$(touch x)": {"complete": True, "revision": REV}, f"{repo}@*": {"complete": True},
                     f"{repo}@aaaaaaaaaaaa": {"complete": True, "revision": "a" * 40}})
    assert len(on_disk) == 3
    assert desired.link_source(f"/m/{repo}@0123456789ab", REV, on_disk) == (f"/m/{repo}@aaaaaaaaaaaa", "a" * 40)
    assert desired.link_source(f"/m/{repo}@0123456789ab", REV, typed({f"{repo}@$(x)": {"complete": True}})) is None
