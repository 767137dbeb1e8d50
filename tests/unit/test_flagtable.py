"""The one flag table (flagtable.py): order, owner and setting of every flag nemofleet emits or owns.
A new setting that sets one flag touches settings.py (its Key) and flagtable.py (its row), and
vllm_flags.py only when the stand-in's table lacks the flag: at most 3 source files."""

import pytest

from nemofleet import flagtable, settings, vllm_flags
from nemofleet.flagtable import Emitted


def test_every_setting_row_names_a_setting_and_every_emitted_flag_is_known_to_a_pinned_vllm():
    for e in flagtable.FROM_SETTINGS:
        assert e.setting in settings.BY_NAME, e
    known = set().union(*(vllm_flags.get(v).flags for v in vllm_flags.VERSIONS))
    assert [e.flag for e in flagtable.TABLE if e.emitted and e.flag not in known] == []


def test_rows_are_unique_and_owned_flags_say_what_decides_them():
    assert len({e.flag for e in flagtable.TABLE}) == len(flagtable.TABLE)
    assert flagtable.owned_setting("--speculative-config.method") == "speculative and num_speculative_tokens"
    assert flagtable.owned_setting("--enable-prefix-caching") is None  # a recipe flag: extras may override it


def test_a_setting_row_is_emitted_with_its_value_a_switch_without_one_and_unset_not_at_all(monkeypatch):
    s = settings.parse({"kv_cache_dtype": "fp8"})
    assert ("--kv-cache-dtype", "fp8") in flagtable.from_settings(s)
    assert "--kv-cache-dtype" not in dict(flagtable.from_settings(settings.parse({})))
    # a new flag-setting is one row (here a bool setting as a switch): no code in the plan
    monkeypatch.setattr(flagtable, "FROM_SETTINGS",
                        flagtable.FROM_SETTINGS + (Emitted("--enforce-eager", setting="health_check_infer"),))
    assert ("--enforce-eager", None) in flagtable.from_settings(settings.parse({"health_check_infer": True}))
    assert "--enforce-eager" not in dict(flagtable.from_settings(settings.parse({"health_check_infer": False})))


@pytest.mark.parametrize("flags, want", [
    ([("--port", 8000), ("--max-model-len", 1), ("--x-extra", 1), ("--served-model-name", "a"), ("--y", None)],
     ["--served-model-name", "--max-model-len", "--port", "--x-extra", "--y"]),
])
def test_planned_flags_follow_the_table_and_unknown_ones_keep_their_order_after_it(flags, want):
    assert [n for n, _ in flagtable.ordered(flags)] == want
