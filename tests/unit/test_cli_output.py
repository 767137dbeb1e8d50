"""Output that reads: `nemofleet plan` wraps within 120 columns at a terminal (whole lines when
piped or with -v), a warning several hosts share is said once, and the deploy's preflight says a
long warning in full once per run, then points to it."""

from __future__ import annotations

import io

from nemofleet import cli, factmodel
from test_plan import FLEET, VL, _facts_with, _plan_facts  # the plan-from-facts harness of test_plan


class Tty(io.StringIO):
    def isatty(self):
        return True


def plan_text(tmp_path, monkeypatch, *argv_extra, tty=True):
    hosts = {"a100-4": (_facts_with(FLEET["a100x4"]), VL), "a100-5": (_facts_with(FLEET["a100x4"]), VL)}
    out = Tty() if tty else io.StringIO()
    _plan_facts(tmp_path, monkeypatch, hosts)  # writes the inventory and facts file
    monkeypatch.setattr("sys.stdout", out)
    rc = cli.main(["plan", next(p.name for p in tmp_path.glob("inv_*.py")), "--facts", "facts.json", *argv_extra])
    return rc, out.getvalue()


def test_plan_at_a_terminal_stays_within_120_columns_and_says_a_shared_warning_once(tmp_path, monkeypatch):
    rc, out = plan_text(tmp_path, monkeypatch)
    assert rc == 0, out
    assert max(len(line) for line in out.splitlines()) <= 120, out
    assert out.count("its card calls the safe line") == 1
    assert "== warnings shared by several hosts (said once)" in out
    assert "warning (every host): " in out
    # the GPU-class warning, the card's safe line and the image CUDA known only from the table (vllm_image_cuda)
    assert out.count("   warnings: 3 shared with other hosts, said once below") == 2
    assert any(line.startswith("   flags") for line in out.splitlines())


def test_plan_piped_or_verbose_keeps_each_line_whole(tmp_path, monkeypatch):
    rc, piped = plan_text(tmp_path, monkeypatch, tty=False)
    flags = [line for line in piped.splitlines() if line.startswith("   flags")]
    assert flags and all("..." not in line for line in flags)
    rc, verbose = plan_text(tmp_path, monkeypatch, "-v")
    assert [line for line in verbose.splitlines() if line.startswith("   flags")] == flags


def test_flag_lines_keep_flags_whole_and_shorten_long_values():
    line = "flags: " + " ".join(f"--flag-number-{i} {i}" for i in range(20)) + ' --speculative-config {"method":"mtp","num_speculative_tokens":3}'
    parts = cli._flag_lines(line)
    assert all(len(p) + 3 <= 120 for p in parts)
    assert parts[0].startswith("flags: --flag-number-0 0") and parts[1].startswith("     --flag-number-")
    assert parts[-1].endswith('--speculative-config {"method":"mtp","num_speculative_toke...')  # 37 characters of the value, then ...
    assert " ".join(" ".join(parts).split()).count("--flag-number-") == 20


def test_the_deploy_says_a_long_warning_once_per_run(monkeypatch):
    from nemofleet.operations import preflight

    said = []

    class Host:
        name = ""

        def log(self, text, fn):
            said.append((self.name, text))

        def noop(self, text):
            pass

    h = Host()
    monkeypatch.setattr(preflight, "host", h)
    monkeypatch.setattr(preflight, "_SAID", {})
    long = "NVFP4 weights on this GPU run through a slower path: " + "x" * 300
    for name in ("h1", "h2", "h3"):
        h.name = name
        list(preflight.verdict._inner([], [long, "short note"]))
    assert said[0] == ("h1", f"preflight warning: {long}")
    assert ("h2", "preflight warning: as said above for h1 (NVFP4 weights on this GPU run through a slower path: xxxxxxx...)") in said  # its first 60 characters
    assert [t for n, t in said if n == "h3"][1] == "preflight warning: short note"
    assert sum(long in t for _, t in said) == 1


def test_the_testbeds_tiny_checkpoint_is_named_where_its_size_drives_the_figures():
    from nemofleet.models import host_dir_name

    plan = {"repo": "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4", "revision": "a" * 40}
    meta = {"complete": True, "total_size": int(3.4 * 1024**3), "config": {"nemofleet_tiny": "base"}}
    facts = {"models": {host_dir_name(plan["repo"], plan["revision"]): meta}}
    typed = lambda f: factmodel.parse(f)[0]  # noqa: E731  as inputs.make hands them to cmd_plan
    assert cli._tiny_checkpoint(typed(facts), plan) == (
        "the weights on this host are the testbed's tiny checkpoint (3.4 GiB), not "
        "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4: the memory figures use its size")
    meta["config"] = {"architectures": ["NemotronHForCausalLM"]}  # a real checkpoint: nothing said
    assert cli._tiny_checkpoint(typed(facts), plan) is None
    assert cli._tiny_checkpoint(typed({"models": "junk"}), plan) is None and cli._tiny_checkpoint(typed(facts), None) is None


def test_the_hosts_weights_check_keeps_the_tiny_checkpoints_mark(tmp_path):
    """What the note reads reaches the facts: models_on_disk keeps config.json's nemofleet_tiny."""
    import json as _json

    from nemofleet import remote

    models_on_disk = {"__name__": "models_on_disk"}  # the text a host runs (its prelude first), not run as main
    exec(compile(remote.source("models_on_disk"), "models_on_disk.py", "exec"), models_on_disk)
    (tmp_path / "config.json").write_text(_json.dumps({"architectures": ["X"], "nemofleet_tiny": "base"}))
    assert models_on_disk["describe"](str(tmp_path))["config"] == {"architectures": ["X"], "nemofleet_tiny": "base"}


def test_plan_facts_without_an_api_key_still_shows_what_it_would_run(tmp_path, monkeypatch):
    """The offline preview (before the secrets exist on this controller): the missing key is one
    refusal line, and the instances, flags and memory are shown all the same."""
    import json as _json

    from test_plan import _facts_with, FLEET, VL

    (tmp_path / "facts.json").write_text(_json.dumps({"a100-4": _facts_with(FLEET["a100x4"])}))
    inv = f"inv_{tmp_path.name.replace('-', '_')}.py"
    (tmp_path / inv).write_text("hosts = " + repr([("a100-4", dict(VL))]) + "\n")
    monkeypatch.chdir(tmp_path)
    for extra in ([], ["--json"]):
        out = io.StringIO()
        monkeypatch.setattr("sys.stdout", out)
        rc = cli.main(["plan", inv, "--facts", "facts.json", *extra])
        text = out.getvalue()
        assert rc == 1
        if extra:
            doc = _json.loads(text)["a100-4"]
            assert doc["plan"] is None and doc["preview"]["instances"], doc
            assert [r for r in doc["refused"] if r.startswith("no API key")] == doc["refused"]
        else:
            assert text.count("REFUSED: no API key") == 1 and "it would run:" in text
            assert any(line.startswith("   flags") for line in text.splitlines()), text
