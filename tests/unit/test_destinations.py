"""Every value nemofleet writes is checked by the program that reads it.

A hostile string is either refused by the settings schema, or it reaches its destination intact
and inert: the health program reads its JSON config and runs (with stub tools) without executing it,
systemd (`systemd-analyze verify`) accepts the units and the Docker drop-in, cron gets exactly
one line, daemon.json stays JSON. The quoting is also tested on its own, with values the schema
would refuse, so it does not depend on the schema alone."""
import dataclasses
import json
import os
import re
import shutil
import sys
import subprocess
from pathlib import Path

import pytest

from nemofleet import desired, paths, render, settings
from test_desired import REV, SECRETS, facts

HOSTILE = ["a\nb", "$(touch {pwned})", "`touch {pwned}`", "x; touch {pwned}", "a b", "a'b", 'a"b', "50%", "%h",
           "a,b=c", "a\\b", "-x", "a:b", "${{HOME}}", "a}}b{{", "--network=host", "\u00e9\u202e", ""]
BASE = {"model": {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": REV},
        "health_webhook_url": "https://hooks.example.internal/T0/abc", "http_proxy": "http://proxy.internal:3128",
        "frontends": [{"name": "open-webui", "network": "open-webui_default", "alias": "nemotron"}]}
STRING_KEYS = sorted(k.name for k in settings.KEYS if str in k.types and not k.secret)


def systemd_analyze() -> str:
    exe = shutil.which("systemd-analyze")
    if not exe:
        pytest.fail("systemd-analyze is needed to check rendered units (Debian: apt-get install systemd)")
    return exe


def verify_units(units: dict[str, str], tmp: Path) -> None:
    """systemd's own parser over every unit (and drop-in) as it would be installed."""
    d = tmp / "units"
    d.mkdir(exist_ok=True)
    names = []
    for path, text in units.items():
        rel = Path(path).relative_to("/etc/systemd/system")
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
        if rel.parent == Path("."):
            names.append(str(d / rel))
    if any(Path(p).parent.name == "docker.service.d" for p in units):
        (d / "docker.service").write_text("[Service]\nExecStart=/bin/true\n")
        names.append(str(d / "docker.service"))
    r = subprocess.run([systemd_analyze(), "verify", "--man=no", *names], capture_output=True, text=True,
                       env=dict(os.environ, SYSTEMD_UNIT_PATH=f"{d}:"), timeout=60)
    # docker.service and network targets are not installed here: only this file's own errors count
    errors = [ln for ln in (r.stdout + r.stderr).splitlines()
              if str(d) in ln and "not executable" not in ln and "No such file" not in ln]
    assert not errors, "\n".join(errors) + "\n" + "\n".join(f"--- {k}\n{v}" for k, v in units.items())


def bash_parses(script: str) -> None:
    r = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr + script


def cron_lines(text: str) -> list[list[str]]:
    """The entries of an /etc/cron.d file as cron reads them: 5 time fields (or @keyword), user, command."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#") or re.match(r"^[A-Z_]+=", line):
            continue
        fields = line.split()
        n = 1 if fields[0].startswith("@") else 5
        out.append([" ".join(fields[:n]), fields[n], " ".join(fields[n + 1:])])
    return out


def check_destinations(d: desired.Desired, tmp: Path) -> None:
    # the health program is the same file on every host; the values are in its JSON config
    assert d.health_files[paths.HEALTH_SCRIPT][0] == render.health_program()
    json.loads(d.health_files[paths.HEALTH_CONFIG][0])
    for cmd in (d.cdi_command, d.keep_previous_command, d.ready_command):
        if cmd:
            bash_parses(cmd)
    units = {p: c for p, (c, _) in d.units.items()}
    if paths.DOCKER_PROXY in d.host_files:
        units[paths.DOCKER_PROXY] = d.host_files[paths.DOCKER_PROXY][0]
    verify_units(units, tmp)
    entries = cron_lines(d.health_files[paths.HEALTH_CRON][0])
    assert len(entries) == 1 and entries[0][1] == "root", entries
    json.dumps(d.daemon_json)  # JSON-able, as the daemon.json op writes it
    for text, _ in d.secret_files.values():
        if text.startswith("#") or "=" in text.split("\n", 1)[0]:
            assert all(re.match(r"^(#.*|[A-Za-z_][A-Za-z0-9_]*=.*|)$", ln) for ln in text.splitlines()), text


def test_the_baseline_passes_every_consumer(tmp_path):
    d = desired.build("h", BASE, facts(), SECRETS)
    assert d.ok, d.refusals
    check_destinations(d, tmp_path)


@pytest.mark.parametrize("key", STRING_KEYS)
def test_every_string_setting_is_refused_or_lands_inert(key, tmp_path):
    pwned = tmp_path / "pwned"
    for raw in HOSTILE:
        value = raw.format(pwned=pwned)
        try:
            settings.parse({**BASE, key: value})
        except settings.SettingsError as exc:
            assert len(exc.problems) == 1 and key in exc.problems[0], exc.problems
            continue
        d = desired.build("h", {**BASE, key: value}, facts(), SECRETS)
        if not d.ok:
            assert d.refusals  # refused later (e.g. an image tag the flag table does not know)
            continue
        check_destinations(d, tmp_path)
    assert not pwned.exists()


MODEL_STRINGS = ["served_name", "repo", "reasoning_parser", "tool_call_parser"]


@pytest.mark.parametrize("field", MODEL_STRINGS)
def test_model_mapping_strings_are_refused_or_land_inert(field, tmp_path):
    pwned = tmp_path / "pwned"
    for raw in HOSTILE:
        value = raw.format(pwned=pwned)
        data = {**BASE, "model": {**BASE["model"], field: value}}
        d = desired.build("h", data, facts(), SECRETS)
        if d.ok:
            check_destinations(d, tmp_path)
    assert not pwned.exists()


@pytest.mark.parametrize("raw", HOSTILE)
def test_extra_flag_values_reach_systemd_as_one_word(raw, tmp_path):
    value = raw.format(pwned=tmp_path / "pwned")
    try:
        settings.parse({"vllm_extra_args": {"--override-generation-config": value}})
    except settings.SettingsError:
        return
    d = desired.build("h", {**BASE, "vllm_extra_args": {"--override-generation-config": value}}, facts(), SECRETS)
    if d.ok:
        check_destinations(d, tmp_path)


# --- the quoting itself, with values the schema would refuse (defence in depth)

def _plan_and_settings():
    d = desired.build("h", BASE, facts(), SECRETS)
    assert d.ok, d.refusals
    return d.plan, d.settings


def run_health(config: str, tmp: Path) -> tuple[str, str]:
    """Run the health program with a rendered config against stub curl/systemctl (they log their argv as JSON)."""
    stubs = tmp / "bin"
    stubs.mkdir(exist_ok=True)
    log = tmp / "argv.log"
    for tool in ("curl", "systemctl"):
        (stubs / tool).write_text("#!/usr/bin/env python3\nimport json, sys\n"
                                  f"open({str(log)!r}, 'a').write(json.dumps(sys.argv) + '\\n')\n"
                                  "print('200' if '-w' in sys.argv else '{\"data\": []}')\n")
        (stubs / tool).chmod(0o755)
    text = (config.replace("/var/lib/nemofleet/health", str(tmp / "state"))
            .replace("/etc/nemofleet/", str(tmp / "etc") + "/"))
    (tmp / "health.json").write_text(text)
    (tmp / "health.py").write_text(render.health_program())
    r = subprocess.run([sys.executable, "-I", "-S", str(tmp / "health.py"), str(tmp / "health.json")],
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{stubs}:/usr/bin:/bin", "PROM_DIR": str(tmp / "prom"), "CHECK_INFER": "1",
                            "CHECK_MODELS": "0",
                            "HOME": str(tmp)})
    return r.stdout + r.stderr, log.read_text() if log.exists() else ""


@pytest.mark.parametrize("raw", [h for h in HOSTILE if h])  # JSON carries a newline too
def test_health_program_carries_a_hostile_served_name_as_data(raw, tmp_path):
    pwned = tmp_path / "pwned"
    value = raw.format(pwned=pwned)
    plan, s = _plan_and_settings()
    plan = dataclasses.replace(plan, served_name=value)
    config = render.health_config(plan, s)
    assert json.loads(config)["instances"][0]["model"] == value
    out, argv = run_health(config, tmp_path)
    assert not pwned.exists() and "Traceback" not in out, out
    bodies = [a for line in argv.splitlines() for a in json.loads(line) if a.startswith('{"model":')]
    assert any(json.loads(b)["model"] == value for b in bodies), (value, bodies, out)


@pytest.mark.parametrize("raw", HOSTILE)
def test_systemd_word_survives_systemds_parser(raw, tmp_path):
    value = raw.replace("\n", " ").format(pwned=tmp_path / "pwned")
    unit = f"[Service]\nExecStart=/bin/echo {render.systemd_word(value)} {render.systemd_word('next')}\n"
    verify_units({"/etc/systemd/system/q.service": unit}, tmp_path)


def test_cron_file_has_one_entry_for_every_accepted_schedule():
    for schedule in ("*/5 * * * *", "@hourly", "0 3 * * 1-5"):
        entries = cron_lines(render.health_cron(settings.parse({"health_schedule": schedule})))
        assert len(entries) == 1 and entries[0][0] == schedule and entries[0][1] == "root", entries
