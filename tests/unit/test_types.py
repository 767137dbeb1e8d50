"""Types at the edge: every value a user gives becomes a typed value once, or one sentence.

Finite numbers, maxima on every integer, cron fields per position, IP addresses without IPv6
scope ids, host names without newlines, Hub repo ids and revisions by their grammar, and every
nested field of `model`, `drafts`, `frontends`, `gateway_backends`, `weights_seed_from`."""
import dataclasses
import math

import pytest

from nemofleet import models, settings, valuetypes

CATALOG_KEY = "nemotron-3.5-lightning-nvfp4"
HOSTILE = ["a\nb", "$(touch /tmp/x)", "`id`", "x; id", "a b", "a'b", 'a"b', "50%", "..", "../x", "/abs",
           "-x", "a\\b", "*", "", "\u202e", "a\x00b"]
NON_FINITE = [math.nan, math.inf, -math.inf]


def refused(data: dict) -> str:
    """The one sentence a bad value gets (a SettingsError, never any other exception)."""
    with pytest.raises(settings.SettingsError) as exc:
        settings.parse(data)
    assert len(exc.value.problems) == 1, exc.value.problems
    sentence = exc.value.problems[0]
    assert "\n" not in sentence.replace("\\n", "") and "Traceback" not in sentence
    return sentence


# ---------------------------------------------------------------------------- numbers

NUMBER_KEYS = sorted(k.name for k in settings.KEYS if int in k.types or float in k.types)


@pytest.mark.parametrize("key", NUMBER_KEYS)
@pytest.mark.parametrize("value", NON_FINITE)
def test_nan_and_inf_refused_for_every_number_key(key, value):
    assert key in refused({key: value})


def test_nan_from_data_arrives_as_json_and_is_refused():
    # pyinfra's --data k=v parses values with json.loads: "NaN" becomes float('nan')
    from pyinfra_cli.util import parse_cli_arg

    assert "not a finite number" in refused({"gpu_memory_utilization": parse_cli_arg("NaN")})
    assert "not a finite number" in refused({"vllm_extra_args": {"max-loras": math.inf}})


@pytest.mark.parametrize("value", [10**30, -(10**30), 2**53 + 1, 1e300, "1e999", "inf", "-nan", '{"a": 1e999}',
                                   '{"a": [NaN]}', '[{"b": Infinity}]', '{"a": {"b": 1' + "0" * 30 + '}}', "{not json"])
@pytest.mark.parametrize("key", ["vllm_extra_args", "instance_extra_args"])
def test_extra_args_numbers_are_bounded_also_inside_json_text(key, value):
    flags = {"max-loras": value}
    data = {key: flags if key == "vllm_extra_args" else {"i0": flags}}
    assert "flag max-loras" in refused(data) and ("at most 9007199254740992" in refused(data) or "JSON" in refused(data))
    ok = {"max-loras": 4, "gpu-memory-utilization": 0.9, "speculative-config": '{"num_speculative_tokens": 3}',
          "seed": -1, "kv-cache-dtype": "fp8", "enforce-eager": True, "hf-overrides": '{"rope_scaling": {"factor": 1e-3}}'}
    settings.parse({"vllm_extra_args": ok})


INT_KEYS = [k for k in settings.KEYS if int in k.types]


@pytest.mark.parametrize("key", INT_KEYS, ids=lambda k: k.name)
def test_every_integer_setting_has_a_maximum_and_is_held_to_it(key):
    assert key.maximum is not None, f"{key.name} has no maximum"
    assert "at most" in refused({key.name: int(key.maximum) + 1})
    assert key.name in refused({key.name: 2**70})


@pytest.mark.parametrize("key", ["ready_timeout", "start_timeout", "health_restart_grace"])
def test_timeouts_overflowing_shell_arithmetic_refused(key):
    assert "at most 86400" in refused({key: 2**64})


@pytest.mark.parametrize("data", [
    {"port_base": True}, {"front_door_port": True},
    {"weights_seed_from": {"host": "peer", "port": True}},
    {"gateway_backends": [{"host": "10.0.0.1", "port": True}]},
    {"weights_seed_from": {"host": "peer", "port": 0}},
    {"gateway_backends": [{"host": "10.0.0.1", "port": 65536}]},
])
def test_a_bool_is_not_a_port(data):
    refused(data)


# ---------------------------------------------------------------------------- cron


@pytest.mark.parametrize("schedule, why", [
    ("99 99 99 99 99", "minute 99 is outside 0-59"),
    ("*/0 * * * *", "step /0"),
    ("* 24 * * *", "hour 24"),
    ("* * 0 * *", "day of month 0"),
    ("* * 32 * *", "day of month 32"),
    ("* * * 13 *", "month 13"),
    ("* * * * 8", "day of week 8"),
    ("5-1 * * * *", "runs backwards"),
    ("*/99 * * * *", "step /99"),
    ("1,,2 * * * *", "is not `*`"),
    ("*-5 * * * *", "is not `*`"),
    ("*  * * * *", "is not valid here"),
    ("@reboot", "is not valid here"),
])
def test_cron_fields_checked_per_position(schedule, why):
    assert why in refused({"health_schedule": schedule})


@pytest.mark.parametrize("schedule", ["* * * * *", "*/5 * * * *", "0 0 * * 7", "1,2,10-20/2 0-23 1-31 1-12 0-7",
                                      "@daily", "@hourly", "59 23 31 12 6"])
def test_cron_schedules_cron_runs_accepted(schedule):
    assert settings.parse({"health_schedule": schedule}).health_schedule == schedule


# ---------------------------------------------------------------------------- addresses and names

IP_KEYS = ["bind_address", "front_door_address", "gateway_address"]
SCOPED = ["::1%$(id)", "fe80::1%eth0", "fe80::1%`id`", "::1%a b", "fe80::1%;reboot"]


@pytest.mark.parametrize("key", IP_KEYS)
@pytest.mark.parametrize("value", SCOPED)
def test_ipv6_scope_ids_refused(key, value):
    assert "scope id" in refused({key: value})


@pytest.mark.parametrize("value", SCOPED + ["a\nb", "a b", "host\n server x 1.2.3.4:1", "-x", "a..b", "x" * 254])
def test_gateway_backend_host_is_an_address_or_a_host_name(value):
    assert "entry 1: host" in refused({"gateway_backends": [{"host": value, "port": 8800}]})


def test_gateway_backend_names_and_hosts_accepted():
    s = settings.parse({"gateway_backends": [{"host": "gpu-1.example", "port": 8800},
                                             {"host": "fd00::1", "port": 8800, "name": "b"}]})
    assert len(s.gateway_backends) == 2


@pytest.mark.parametrize("members", [["a\nb", "c"], ["a", "b c"], ["a", "a"], ["a"]])
def test_group_members_are_host_names(members):
    refused({"serving_group": "g", "serving_group_members": members})


@pytest.mark.parametrize("net", ["10.0.0.0/8%x", "fe80::%eth0/64", "x", 5])
def test_group_networks_are_cidr_without_scope(net):
    refused({"serving_group_network": [net]})


def test_the_same_frontend_network_twice_refused():
    why = refused({"frontends": [{"network": "web"}, {"network": "web", "alias": "b"}]})
    assert "'web' twice" in why


@pytest.mark.parametrize("data", [{1: 2}, {None: 1}, {("a",): 1}, {b"model": "x"}])
def test_a_setting_name_that_is_not_a_string_is_one_sentence(data):
    assert "setting names must be strings" in refused(data)


@pytest.mark.parametrize("name", ["nvidia-driver-{x}", "nvidia-{", "nvidia-{branch.upper}", "a}", "{branch}{"])
def test_driver_package_format_fields_restricted_to_branch(name):
    refused({"nvidia_driver_packages": [name]})


def test_driver_package_branch_expands():
    s = settings.parse({"nvidia_driver_packages": ["nvidia-driver-{branch}-server"]})
    assert s.nvidia_driver_packages == ("nvidia-driver-{branch}-server",)  # lists are typed as tuples


@pytest.mark.parametrize("seed", [{"host": "peer", "key": 5}, {"host": "peer", "key": "a b"},
                                  {"host": "peer", "key": "$(id)"}, {"host": "peer", "user": 0},
                                  {"host": "peer", "user": "a\nb"}, {"host": "peer\n"}, {"host": 5}])
def test_weights_seed_from_fields_typed(seed):
    assert "weights_seed_from" in refused({"weights_seed_from": seed})


# ---------------------------------------------------------------------------- the model mapping


def test_every_model_field_has_a_type():
    assert set(models.FIELD_TYPES) == {f.name for f in dataclasses.fields(models.Model) if f.compare}


# values no field takes: strings with shell, unit and path metacharacters, non-finite and
# out-of-range numbers, wrong types
BAD_ANY = HOSTILE + NON_FINITE + [-5, 10**30, 1.5, 2.0]
# values some fields take (a bool, an empty list or mapping, a plain word)
ODD = [True, [], {}, "1e3", None]


@pytest.mark.parametrize("field", sorted(models.FIELD_TYPES))
@pytest.mark.parametrize("value", BAD_ANY, ids=repr)
def test_hostile_values_for_every_model_field(field, value):
    """Every nested field refuses them in one sentence that names the field."""
    spec = {"catalog": CATALOG_KEY, field: value}
    with pytest.raises(models.UnknownModel) as exc:
        models.resolve(spec)
    assert str(exc.value).startswith(f"model {field} "), exc.value
    assert f"model {field} " in refused({"model": spec})


@pytest.mark.parametrize("field", sorted(models.FIELD_TYPES))
@pytest.mark.parametrize("value", ODD, ids=repr)
def test_odd_values_for_every_model_field_are_typed_or_one_sentence(field, value):
    spec = {"catalog": CATALOG_KEY, field: value}
    try:
        m = models.resolve(spec)
    except models.UnknownModel as exc:
        assert str(exc).startswith(f"model {field} ")
        return
    assert models.FIELD_TYPES[field](getattr(m, field)) == getattr(m, field)


@pytest.mark.parametrize("spec, words", [
    ({"repo": "a/b'c", "weight_bytes": 10}, "repo"),
    ({"repo": "..", "weight_bytes": 10}, "repo"),
    ({"repo": "../..", "weight_bytes": 10}, "repo"),
    ({"repo": "a/b--c", "weight_bytes": 10}, "repo"),
    ({"repo": "a/b", "weight_bytes": -5}, "weight_bytes"),
    ({"repo": "a/b", "weight_bytes": "5"}, "weight_bytes"),
    ({"repo": "a/b", "weight_bytes": math.nan}, "weight_bytes"),
    ({"repo": "a/b", "weight_bytes": 10, "kv_heads": 0}, "kv_heads"),
    ({"repo": "a/b", "weight_bytes": 10, "max_context": "big"}, "max_context"),
    ({"catalog": CATALOG_KEY, "revision": "main/../../x"}, "revision"),
    ({"catalog": CATALOG_KEY, "revision": "/main"}, "revision"),
    ({"catalog": CATALOG_KEY, "revision": "-x"}, "revision"),
    ({"catalog": CATALOG_KEY, "revision": "a\nb"}, "revision"),
    ({"catalog": CATALOG_KEY, "drafts": {"dflash": {"repo": "a/b\nExecStartPre=/bin/sh"}}}, "drafts"),
    ({"catalog": CATALOG_KEY, "drafts": {"dflash": {"repo": "a/b", "revision": "x y"}}}, "drafts"),
    ({"catalog": CATALOG_KEY, "drafts": {"eagle": {"repo": "a/b"}}}, "drafts"),
    ({"catalog": CATALOG_KEY, "drafts": {"dflash": "a/b"}}, "drafts"),
    ({"catalog": CATALOG_KEY, "reasoning_parser_plugin": "../../etc/x.py"}, "reasoning_parser_plugin"),
    ({"catalog": CATALOG_KEY, "reasoning_parser_plugin": "$(id).py"}, "reasoning_parser_plugin"),
    ({"catalog": CATALOG_KEY, "speculative": ["mtp", "x"]}, "speculative"),
    ({"catalog": CATALOG_KEY, "multimodal_limits": {"image": math.inf}}, "multimodal_limits"),
    ({"catalog": CATALOG_KEY, 5: 1}, "strings"),
    ({"catalog": 5}, "unknown model"),
])
def test_nested_model_fields_refused_in_one_sentence(spec, words):
    assert words in refused({"model": spec})


def test_good_overrides_are_typed():
    m = models.resolve({"catalog": CATALOG_KEY, "revision": "v1.0/rc-2", "speculative": ["mtp"],
                        "drafts": {"dflash": {"repo": "org/Draft-1.5", "revision": "a" * 40}}})
    assert m.speculative == ("mtp",) and m.drafts["dflash"] == models.Draft("org/Draft-1.5", "a" * 40)
    g = models.resolve({"repo": "Org_1/My.Model-7B", "weight_bytes": 10**9, "kv_heads": 4})
    assert (g.weight_bytes, g.kv_heads, g.max_context) == (10**9, 4, 32768)


# ---------------------------------------------------------------------------- the types alone


@pytest.mark.parametrize("value", ["main", "v1.0", "refs/pr/1", "a" * 40, "release/2026-12"])
def test_revision_grammar_accepts_branches_tags_commits(value):
    assert valuetypes.revision_problem(value) is None


@pytest.mark.parametrize("value", ["", "a..b", "/a", "a/", "a//b", "-a", "a.lock", "a b", "a\n", "a~1", "a^", "a:b",
                                   "a@{1}", "a*", "a?", "a[", "a\\b", ".a", "a/.b", 5, None])
def test_revision_grammar_refuses_what_git_would(value):
    assert valuetypes.revision_problem(value)


@pytest.mark.parametrize("value", ["nvidia/X", "a/b.c", "A_1/b-2"])
def test_repo_ids_as_the_hub_defines_them(value):
    assert valuetypes.repo_problem(value) is None


@pytest.mark.parametrize("value", ["x", "a/b/c", "a/-b", "a/b.", "a/b--c", "a/b..c", "a/" + "b" * 96, ".a/b", "a /b"])
def test_repo_ids_the_hub_refuses(value):
    assert valuetypes.repo_problem(value)


# ---------------------------------------------------------------------------- secrets and CLI arguments


@pytest.mark.parametrize("data", [{"hf_endpoint": "https://user:pass@mirror.internal"},
                                  {"hf_endpoint": "http://token@mirror.internal:8080/hf"},
                                  {"docker_registry_mirrors": ["https://ok.internal", "https://u:p@mirror.internal"]}])
def test_credentials_in_a_mirror_url_refused_with_where_to_put_them(data):
    why = refused(data)
    assert "carries credentials" in why and ("hf_token_file" in why or "docker login" in why)
    assert "pass" not in why.split("carries credentials")[0]


def test_a_mirror_url_without_credentials_accepted():
    assert settings.parse({"hf_endpoint": "https://mirror.internal/hf"}).hf_endpoint == "https://mirror.internal/hf"


@pytest.mark.parametrize("argv", [["rollout", "inv.py", "--wait", "nan"], ["rebuild", "inv.py", "h", "--wait", "nan"],
                                  ["rollout", "inv.py", "--wait", "inf"], ["rollout", "inv.py", "--wait", "0"],
                                  ["rollout", "inv.py", "--wait", "1e9"], ["rollback", "inv.py", "--wait=-inf"]])
def test_cli_waits_are_finite_and_bounded(argv, capsys):
    from nemofleet import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "finite number of seconds" in err and "Traceback" not in err


@pytest.mark.parametrize("key", ["vllm_api_key", "hf_token", "health_webhook_url"])
def test_a_secret_never_goes_onto_pyinfras_command_line(key):
    from nemofleet import cli

    with pytest.raises(SystemExit) as exc:
        cli._data([f"{key}=s3cret-value-123"])
    assert "command line" in str(exc.value) and "s3cret" not in str(exc.value)


@pytest.mark.parametrize("name", ["h\nserver evil 10.6.6.6:80", "h\r", "h\tx", " "])
def test_an_inventory_host_name_with_a_newline_is_refused(name):
    from nemofleet import inputs
    from test_desired import SECRETS, facts

    i = inputs.make(name, {}, facts(), SECRETS)
    assert any("inventory host name" in r for r in i.refusals)


# every key, values of every shape (mappings with non-string keys, nested NaN, lists of mappings...)
SHAPES = [None, True, 0, -1, 2**80, 1.5, math.nan, "", "x", "\n", [], [None], [1, "a"], [{}], [{1: 2}], [[math.inf]],
          {}, {1: 2}, {"a": None}, {"a": [math.nan]}, {None: "x"}, {"host": "h", 1: 2}, {"network": "n", 2: 3},
          [{"network": "n", 1: 2}], [{"host": "h", "port": 1, 5: 6}], {"catalog": CATALOG_KEY, "drafts": {1: 2}},
          {"repo": "a/b", "weight_bytes": 1, "drafts": {"mtp": {"repo": "a/b", 1: 2}}}]


@pytest.mark.parametrize("key", sorted(settings.BY_NAME))
def test_no_shape_of_value_raises_anything_but_a_sentence(key):
    for value in SHAPES:
        try:
            settings.parse({key: value})
        except settings.SettingsError as exc:
            assert all("\n" not in p.replace("\\n", "") for p in exc.problems), exc.problems


def test_model_archs_are_the_gpu_architectures_nemofleet_knows():
    from nemofleet import gpus

    assert set(models.ARCHS) == set(gpus.ARCHS)
