"""settings.py: every key declared once, defaults in one place, bad values refused with one
sentence, hostile strings stopped before they reach a shell, cron, systemd or docker option."""
import ast
import re
import runpy
import subprocess
from pathlib import Path

import pytest

from nemofleet import settings
from nemofleet.settings import SettingsError, parse

ROOT = Path(__file__).resolve().parents[2]
KEYS = set(settings.BY_NAME)


def problems(data: dict) -> list[str]:
    with pytest.raises(SettingsError) as exc:
        parse(data)
    return exc.value.problems


def test_defaults_parse_and_hold_every_key():
    s = settings.defaults()
    assert set(type(s).model_fields) == KEYS and not isinstance(s, dict)
    assert s.vllm_image == settings.DEFAULT_IMAGE and s.port_base == 8000


def test_unknown_key_refused_with_did_you_mean():
    assert problems({"gpu_memory_utilisation": 0.9}) == [
        "unknown setting 'gpu_memory_utilisation' (did you mean gpu_memory_utilization?)"]
    assert "nemofleet settings" in problems({"zzz": 1})[0]


def test_pyinfra_keys_and_global_arguments_are_not_ours_to_refuse():
    parse({"ssh_user": "root", "ssh_port": 22, "_sudo": True, "ssh_known_hosts_file": "/x"})


@pytest.mark.parametrize("data, words", [
    ({"port_base": "8000"}, "must be a integer"),
    ({"port_base": True}, "must be a integer"),
    ({"gpu_memory_utilization": 1.5}, "at most 1"),
    ({"gpu_selection": "magic"}, "gpu_selection 'magic' is unknown; use auto, cdi or gpus"),
    ({"docker_registry_mirrors": ["mirror.example:5000"]}, "needs a scheme, e.g. https://mirror.example:5000"),
    ({"models_root": "srv/models"}, "is not valid here"),
    ({"drain_seconds": -1}, "at least 0"),
])
def test_bad_values_one_sentence_each(data, words):
    out = problems(data)
    assert len(out) == 1 and words in out[0], out


HOSTILE = ["a\nb", "$(touch /tmp/pwned)", "`id`", "x; rm -rf /", "a b", "a'b", 'a"b', "50%", "a,b=c"]


@pytest.mark.parametrize("key", ["health_schedule", "prom_dir", "health_webhook_url", "http_proxy", "https_proxy",
                                 "no_proxy", "bind_address", "instance_prefix", "hf_endpoint", "models_root",
                                 "vllm_image", "docker_log_driver"])
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_strings_refused_for_every_destination(key, value):
    if key == "health_schedule" and value == "a b":
        value = "* * * *"  # four fields would put "root" in the weekday field
    with pytest.raises(SettingsError):
        parse({key: value})


def test_cron_schedule_needs_five_fields():
    parse({"health_schedule": "*/5 * * * *"})
    parse({"health_schedule": "@hourly"})
    for bad in ("* * * *", "* * * * * root", "* * * * *\n* * * * * root id"):
        with pytest.raises(SettingsError):
            parse({"health_schedule": bad})


@pytest.mark.parametrize("alias", ["nemotron,alias=x", "a b", "x --network=host", "a\nb"])
def test_frontend_names_cannot_inject_docker_options(alias):
    with pytest.raises(SettingsError):
        parse({"frontends": [{"network": "open-webui_default", "alias": alias}]})


def test_secrets_never_in_messages_or_repr():
    out = problems({"vllm_api_key": "s3cr3t\nINJECT=1"})
    assert "s3cr3t" not in " ".join(out)
    assert "s3cr3t-value-1234" not in repr(parse({"vllm_api_key": "s3cr3t-value-1234"}))


SETTINGS_NAMES = {"s", "data", "settings", "host_data", "d", "want"}


def _is_settings(node) -> bool:
    if isinstance(node, ast.Name):
        return node.id in SETTINGS_NAMES
    if isinstance(node, ast.Attribute):  # host.data
        return node.attr == "data"
    if isinstance(node, ast.Call):  # data()
        return isinstance(node.func, ast.Name) and node.func.id in ("data", "settings")
    return False


def _looks_like_default(node) -> bool:
    """A literal, a CONSTANT or a computed value; a lower-case name is a value being checked."""
    if node is None:
        return False
    if isinstance(node, ast.Name):
        return node.id.isupper()
    return isinstance(node, (ast.Constant, ast.Dict, ast.List, ast.Tuple, ast.Call, ast.Attribute, ast.BinOp))


def _settings_reads(tree: ast.AST):
    """(key, has_default) for every `X.get("key", ...)` and `X["key"]` on a settings key."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        # s.get("key", default) on host data or settings, and helpers such as
        # _setting(data, "key", default); facts and other dicts may share key names
        if not any(_is_settings(x) for x in [getattr(node.func, "value", None), *node.args[:1]]):
            continue
        for n, arg in enumerate(node.args):
            if isinstance(arg, ast.Constant) and arg.value in KEYS:
                nxt = node.args[n + 1] if n + 1 < len(node.args) else None
                yield arg.value, _looks_like_default(nxt), node.lineno


def test_a_default_is_defined_in_exactly_one_place():
    """No code outside settings.py reads a settings key with a default of its own."""
    offenders = []
    for path in sorted((ROOT / "src" / "nemofleet").rglob("*.py")):
        if path.name == "settings.py" or "testbed" in path.parts:
            continue
        for key, has_default, line in _settings_reads(ast.parse(path.read_text())):
            if has_default:
                offenders.append(f"{path.relative_to(ROOT)}:{line} {key}")
    assert not offenders, offenders


def test_group_data_does_not_repeat_a_default():
    for path in sorted((ROOT / "group_data").glob("*.py")):
        values = {k: v for k, v in runpy.run_path(str(path)).items() if k in KEYS}
        repeated = [k for k, v in values.items() if v == settings.BY_NAME[k].default]
        assert not repeated, f"{path.name} repeats the defaults of {repeated}: they live in settings.py"
        unknown = [k for k in runpy.run_path(str(path)) if not k.startswith("_") and k not in KEYS
                   and not k.startswith("__") and k != "os"]
        assert not unknown, f"{path.name}: {unknown}"


def test_the_testbeds_group_data_names_only_settings(tmp_path, monkeypatch):
    """The testbed's group data (inventories/testbed.py's `testbed` group, nemofleet_testbed.groupdata):
    every key a setting, also with the real vLLM server recorded in the state."""
    import nemofleet_testbed
    from nemofleet_testbed import groupdata

    monkeypatch.setenv("NEMOFLEET_TESTBED_DIR", str(tmp_path))
    assert set(groupdata.data()) <= set(KEYS)
    nemofleet_testbed.write_state({"real_vllm": {"model": {"repo": "a/b"}, "image": "i", "archive": "/x.tar"}})
    assert set(groupdata.data()) <= set(KEYS) and groupdata.data()["vllm_image"] == "i"


def test_one_definition_of_the_image():
    out = subprocess.run(["git", "grep", "-n", "vllm/vllm-openai:v", "--", "src", "group_data", "bench"], cwd=ROOT,
                         capture_output=True, text=True).stdout.splitlines()
    assert len(out) == 1 and "settings.py" in out[0] and "DEFAULT_IMAGE" in out[0], out


def test_settings_reference_table_is_generated():
    reference = (ROOT / "docs" / "settings.md").read_text()
    table = settings.markdown_table()
    assert table in reference, "run `make settings-doc` to regenerate docs/settings.md"
    assert re.search(r"<!-- settings:begin -->\n" + re.escape(table) + r"<!-- settings:end -->", reference)


def test_write_reference_replaces_only_the_table_between_its_markers(tmp_path):
    page = tmp_path / "settings.md"
    page.write_text("# Settings\n\nintro\n\n<!-- settings:begin -->\n| stale |\n<!-- settings:end -->\n\nafter\n")
    assert settings.write_reference(str(page)) is True
    assert page.read_text() == ("# Settings\n\nintro\n\n<!-- settings:begin -->\n" + settings.markdown_table()
                                + "<!-- settings:end -->\n\nafter\n")
    assert settings.write_reference(str(page)) is False  # current: unchanged


# Values the settings accepted before they were typed (found by running every settings key with the
# classes of test_hostile_generated through the old and the new parse): each refusal says so
# ("now refused because ...") and what to use instead.
@pytest.mark.parametrize("key, value", [
    ("models_root", "/"), ("models_root", "/etc"), ("prom_dir", "/"), ("prom_dir", "/etc"),
    ("no_proxy", "h" * 5000), ("vllm_image", "9" * 5000), ("kv_cache_dtype", "9" * 5000),
    ("docker_default_runtime", "9" * 5000), ("container_toolkit_version", "9" * 5000),
])
def test_a_value_accepted_before_the_typed_settings_says_why_it_is_refused_now(key, value):
    with pytest.raises(settings.SettingsError) as exc:
        settings.parse({key: value})
    (why,) = exc.value.problems
    assert why.startswith(key) and "now refused because" in why and "; use " in why, why
    assert len(why) < 400 and "\n" not in why


def test_a_value_its_type_cannot_take_is_named_with_its_key():
    nested: object = "x"
    for _ in range(50):
        nested = [nested]
    with pytest.raises(settings.SettingsError) as exc:
        settings.parse({"weights_seed_from": nested})
    assert exc.value.problems[0].startswith("weights_seed_from has a value of a shape nemofleet cannot use")
