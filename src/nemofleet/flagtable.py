"""The one table of the vLLM flags nemofleet emits and owns, keyed by flag, in emission order.

Each row says where the flag goes in a planned command line (its position: the order of the
published commands, so a planned line reads like its source), which setting or inventory part
decides it (an operator who passes it in vllm_extra_args is refused and pointed there), and, for
a flag that is just a setting's value, that setting: the plan emits it with no code of its own.
So a new setting that sets one flag is a Key in settings.py and a row here (and, when the stand-in
and the flag table of vllm_flags.py do not know the flag yet, a Flag there): at most 3 files.

What each pinned vLLM version accepts stays apart (vllm_flags.py's tables for what the plan emits
and the testbed's stand-in parses; data/vllm_args_<version>.json generated from the real parsers
for operator flags), and so do the recipe rows that add flags per model and GPU (recipes.py, each
citing its docs/recipes.md section; `if_supported` there is the version gate).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Emitted:
    flag: str
    # what decides the flag (a setting, or a part of the inventory): given as an extra arg it is refused
    # with these words; empty: a recipe flag an operator may override with vllm_extra_args
    owner: str = ""
    # a setting whose value, when it is set (not None/False), is the flag's value (True: a switch);
    # the plan emits these rows itself (layout.planned_flags), after the flags it derives
    setting: str = ""
    # False: never emitted, only owned (an extra arg of it is refused; its position is unused)
    emitted: bool = True


TABLE: tuple[Emitted, ...] = (
    Emitted("--served-model-name", owner="model: {served_name: ...}"),
    Emitted("--trust-remote-code"),
    Emitted("--tensor-parallel-size", owner="tensor_parallel_size"),
    Emitted("--pipeline-parallel-size", owner="serving_group_parallel (PP across the hosts of a serving group)"),
    Emitted("--enable-expert-parallel"),
    Emitted("--max-model-len", owner="max_model_len"),
    Emitted("--gpu-memory-utilization", owner="gpu_memory_utilization"),
    Emitted("--max-num-seqs", owner="max_num_seqs"),
    Emitted("--max-num-batched-tokens", owner="max_num_batched_tokens"),
    Emitted("--kv-cache-dtype", owner="kv_cache_dtype", setting="kv_cache_dtype"),
    Emitted("--enable-prefix-caching"),
    Emitted("--async-scheduling"),
    Emitted("--mamba-backend"),
    Emitted("--moe-backend"),
    Emitted("--linear-backend"),
    Emitted("--mamba-ssu-algorithm"),
    Emitted("--mamba-cache-mode"),
    Emitted("--mamba-ssm-cache-dtype"),
    Emitted("--enable-mamba-cache-stochastic-rounding"),
    Emitted("--mamba-cache-philox-rounds"),
    Emitted("--speculative-config", owner="speculative and num_speculative_tokens"),
    Emitted("--reasoning-parser-plugin"),
    Emitted("--reasoning-parser"),
    Emitted("--tool-call-parser"),
    Emitted("--enable-auto-tool-choice"),
    Emitted("--limit-mm-per-prompt"),
    Emitted("--host", owner="bind_address (the container listens on 0.0.0.0; bind_address sets the host side)"),
    Emitted("--port", owner="port_base"),
    Emitted("--shutdown-timeout", owner="drain_seconds", setting="drain_seconds"),
    # a multi-node group (docs/recipes.md#multi-node): the order of vLLM's own example
    Emitted("--nnodes", owner="the inventory's serving_groups"),
    Emitted("--node-rank", owner="the inventory's serving_groups (the order of the members)"),
    Emitted("--master-addr", owner="the inventory's serving_groups (the head's address in serving_group_network)"),
    Emitted("--master-port", owner="serving_group_master_port"),
    Emitted("--data-parallel-size", owner="instances (on one host) or serving_group_parallel: dp (across hosts)"),
    Emitted("--data-parallel-size-local", owner="serving_group_parallel"),
    Emitted("--data-parallel-start-rank", owner="the inventory's serving_groups"),
    Emitted("--data-parallel-address", owner="the inventory's serving_groups"),
    Emitted("--data-parallel-rpc-port", owner="serving_group_dp_rpc_port"),
    Emitted("--headless", owner="the inventory's serving_groups (every member but the head)"),
    # owned, never emitted: the GPUs are the container's (docker --gpus), the executor is vLLM's mp one
    Emitted("--device-ids", owner="gpus", emitted=False),
    Emitted("--distributed-executor-backend",
            owner="serving_group_parallel (nemofleet runs vLLM's multiprocessing executor)", emitted=False),
)

# emission order; flags the table does not know (operator extras) keep their relative order after these
ORDER = tuple(e.flag for e in TABLE if e.emitted)
OWNED = {e.flag: e.owner for e in TABLE if e.owner}
FROM_SETTINGS = tuple(e for e in TABLE if e.setting)


def owned_setting(flag: str) -> str | None:
    """What decides `flag` instead of an extra arg (also its dotted form, --speculative-config.method)."""
    return OWNED.get(flag.split(".", 1)[0])


def ordered(flags: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """Planned flags in ORDER; flags ORDER does not know keep their relative order at the end."""
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(flags, key=lambda f: rank.get(f[0], len(ORDER)))


def from_settings(s) -> list[tuple[str, object]]:
    """The flags that are a setting's value, for the settings `s` (None for a switch)."""
    values = [(e.flag, getattr(s, e.setting)) for e in FROM_SETTINGS]
    return [(flag, None if value is True else value) for flag, value in values
            if not (value is None or value is False or value == "")]
