"""Every host-data key nemofleet reads, declared once: type, default, allowed values, one line of doc.

This module is the only place a default exists (like an Ansible role's defaults/main.yml).
`parse(data)` turns pyinfra's merged host data into a `Settings` mapping that holds every key,
validated for where its value goes (shell, cron, systemd, docker options); unknown keys are
refused with a "did you mean" sentence. `nemofleet settings` prints this table and the settings
reference, docs/settings.md, is generated from it (a test keeps them equal).

Values are checked here for their *form*; whether they make sense together (a context above the
model's maximum, TP that does not divide the GPUs) is the serving plan's job.
"""

from __future__ import annotations

import difflib
import functools
import re
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union, cast

import pydantic

from . import models
from . import valuetypes as vt
from .secret import Secret

# The one definition of the default vLLM image (the tag the recipes in docs/recipes.md ran).
DEFAULT_IMAGE = "vllm/vllm-openai:v0.27.1"
NVIDIA_TOOLKIT_REPO = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"

# URLs that end up inside double-quoted systemd Environment= lines or JSON: no quotes, %, $,
# backslash or spaces
SAFE_URL = r"https?://[A-Za-z0-9.\-\[\]:@]+(/[A-Za-z0-9._~+,;=:@/-]*)?"
ABS_PATH = r"/[A-Za-z0-9._/+-]*"
HOME_PATH = r"(~|/)[A-Za-z0-9._/+@-]*"
IMAGE = r"[a-z0-9][a-z0-9._/:-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?"
NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"
HOSTNAME = r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}"
# one cron schedule: exactly five fields of digits, * , - / (four would put "root" in the weekday
# field), or an @keyword
CRON = r"[0-9*,/-]+( [0-9*,/-]+){4}|@(hourly|daily|weekly|monthly)"
NO_PROXY = r"[A-Za-z0-9.,:/*\[\]-]+"
# Docker's built-in log drivers (a plugin driver: set it in daemon.json and docker_log_driver: none)
LOG_DRIVERS = ("json-file", "local", "journald", "syslog", "fluentd", "gelf", "awslogs", "splunk", "gcplogs",
               "logentries", "etwlogs", "none")


def _pem_key(value) -> str | None:
    text = value.strip()
    lines = text.splitlines()
    if not (len(lines) > 1 and lines[0].startswith("-----BEGIN ") and lines[-1].startswith("-----END")):
        return "is not a PEM/OpenSSH private key (from a -----BEGIN line to an -----END line)"
    return None


class SettingsError(ValueError):
    """One sentence per bad key."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Key:
    name: str
    types: tuple[type, ...]
    default: Any
    doc: str
    section: str
    pattern: str | None = None  # full match, for str values (and list items)
    choices: tuple | None = None
    minimum: float | None = None
    maximum: float | None = None
    secret: bool = False
    multiline: bool = False  # a PEM key: newlines allowed, other control characters not
    check: Callable[[Any], str | None] | None = None  # extra check of a value of `types` (not None): a sentence or None

    def type_name(self) -> str:
        names = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "mapping",
                 list: "list", type(None): "null"}
        return " or ".join(names.get(t, t.__name__) for t in self.types)


def _frontends(value) -> str | None:
    for fe in value:
        if not isinstance(fe, dict) or not isinstance(fe.get("network"), str):
            return "must be a list of mappings with a network name (and alias, create)"
        extra = sorted(map(str, set(fe) - {"name", "network", "alias", "create"}))
        if extra:
            return f"entry {vt.shown(fe.get('network'))} has unknown keys {', '.join(extra)} (known: name, network, alias, create)"
        for k in ("name", "network", "alias"):
            if fe.get(k) is not None and not (isinstance(fe[k], str) and re.fullmatch(NAME, fe[k])):
                return (f"{k} {vt.shown(fe[k])} must be a Docker name (letters, digits, '_', '.', '-'; no ',' '=' "
                        "or spaces, which would inject docker options)")
        if fe.get("create") is not None and not isinstance(fe["create"], bool):
            return f"create of {vt.shown(fe['network'])} must be true or false"
    networks = [fe["network"] for fe in value]
    twice = sorted({n for n in networks if networks.count(n) > 1})
    if twice:
        return f"name the network {vt.shown(twice[0])} twice; list each frontend network once"
    return None


def _str_map(what: str, key_pattern: str, value_pattern: str) -> Callable[[Any], str | None]:
    def check(value) -> str | None:
        for k, v in (value or {}).items():
            if not isinstance(k, str) or not re.fullmatch(key_pattern, k):
                return f"has a bad {what} key {vt.shown(k)}"
            if not isinstance(v, str) or not re.fullmatch(value_pattern, v):
                return f"value of {vt.shown(k)} must be a string matching {value_pattern} (got {vt.shown(v)})"
        return None
    return check


def _flag_map(value) -> str | None:
    for k, v in (value or {}).items():
        if not isinstance(k, str) or not re.fullmatch(r"(--)?[a-z][a-z0-9_.-]*", k):
            return f"flag {vt.shown(k)} is not a vLLM flag name"
        if isinstance(v, (dict, list)) or v is None or v is False:
            return f"flag {k} needs a value or true (got {vt.shown(v)})"
        if isinstance(v, float) and not vt.is_number(v):
            return f"flag {k} has {vt.shown(v)}, not a finite number"
        if vt.flag_value_problem(v):
            return f"flag {k} {vt.flag_value_problem(v)}"
        if vt.CONTROL.search(str(v)):
            return f"flag {k} has a control character in its value"
    return None


def _instance_flags(value) -> str | None:
    for name, flags in (value or {}).items():
        if not isinstance(flags, dict):
            return f"entry {vt.shown(name)} must be a mapping of flag to value"
        why = _flag_map(flags)
        if why:
            return f"entry {vt.shown(name)}: {why}"
    return None


def _gpu_refs(value) -> str | None:
    for ref in value or []:
        if isinstance(ref, bool) or not (isinstance(ref, int) and 0 <= ref < 1024
                                         or isinstance(ref, str) and re.fullmatch(r"(GPU|MIG)-[0-9a-fA-F-]{8,64}", ref)):
            return f"entry {vt.shown(ref)} is neither a GPU index nor a GPU UUID (GPU-...)"
    if value is not None and not value:
        return "is empty; leave it unset to use every GPU"
    return None


def _seed(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, list):
        # several peers, tried in order (then the mirror): what the fleet fan-out hands a host
        if not 1 <= len(value) <= 8:
            return "must list 1 to 8 peers (tried in order, then the mirror)"
        return next((f"entry {vt.shown(v)} {why}" for v in value for why in [_seed(v)] if why), None)
    if isinstance(value, str):
        value = {"host": value}
    if not isinstance(value, dict) or not isinstance(value.get("host"), str) or not re.fullmatch(HOSTNAME, value["host"]):
        return "must be a peer host name or {host, user, port, key, wait, start, held}"
    extra = sorted(map(str, set(value) - {"host", "user", "port", "key", "wait", "start", "held"}))
    if extra:
        return f"has unknown keys {', '.join(extra)}"
    if value.get("user") is not None and not (isinstance(value["user"], str)
                                              and re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", value["user"])):
        return f"user {vt.shown(value['user'])} is not a user name"
    if value.get("port") is not None and vt.port_problem(value["port"]):
        return f"port {vt.port_problem(value['port'])}"
    key = value.get("key")
    if key is not None and not (isinstance(key, str) and re.fullmatch(HOME_PATH, key)):
        return f"key {vt.shown(key)} must be the path of the private key file on the host (e.g. /root/.ssh/seed)"
    for name, what in (("wait", "may show no progress while it is still fetching the weights itself"),
                       ("start", "may take to begin fetching the weights itself: its directory appears")):
        if value.get(name) is not None and not (vt.is_int(value[name]) and 10 <= value[name] <= 86400):
            return f"{name} {vt.shown(value[name])} must be 10 to 86400 seconds (how long the peer {what})"
    if value.get("held") is not None and not isinstance(value["held"], bool):
        return f"held {vt.shown(value['held'])} must be true or false (copy from the peer only if it holds a verified copy now)"
    if value.get("held") and (value.get("wait") is not None or value.get("start") is not None):
        return "held (copy only if it holds a verified copy now) and wait/start (wait while it fetches) exclude each other"
    return None


GROUP_NAME = r"[a-z0-9][a-z0-9-]{0,30}"


def _members(value) -> str | None:
    if not isinstance(value, list) or len(value) < 2 or not all(isinstance(h, str) and re.fullmatch(HOSTNAME, h)
                                                                for h in value):
        return "must be a list of at least two inventory host names (the head first)"
    if len(set(value)) != len(value):
        return "names a host twice"
    return None


def _networks(value) -> str | None:
    for net in value or []:
        why = vt.network_problem(net)
        if why:
            return why
    return None


def _gateway_backends(value) -> str | None:
    """[{host, port, name}]: each model endpoint of the fleet the gateway balances over (a GPU host's
    front door, or the instance port of a single-instance host)."""
    seen_targets, seen_names = set(), set()
    for n, b in enumerate(value or [], 1):
        if not isinstance(b, dict):
            return f"entry {n} must be a mapping {{host, port, name}}, not {vt.shown(b)}"
        extra = sorted(map(str, set(b) - {"host", "port", "name"}))
        if extra:
            return f"entry {n} has unknown keys {', '.join(map(str, extra))} (known: host, port, name)"
        h, port, name = b.get("host"), b.get("port"), b.get("name")
        if vt.host_problem(h):
            return f"entry {n}: host {vt.host_problem(h)}"
        if vt.port_problem(port):
            return f"entry {n} ({h}): port {vt.port_problem(port)}"
        if name is not None and not (isinstance(name, str) and re.fullmatch(NAME, name)):
            return f"entry {n} ({h}): name {vt.shown(name)} must be letters, digits, '_', '.', '-'"
        name = name or f"{h}:{port}"
        if (h, port) in seen_targets:
            return f"entry {n} repeats {h}:{port}"
        if name in seen_names:
            return f"entry {n} repeats the name {name}"
        seen_targets.add((h, port))
        seen_names.add(name)
    return None


def _model(value) -> str | None:
    """Every field of a model mapping is typed by models.resolve (repo id, revision grammar,
    drafts, parser plugin, sizes): one sentence for the first that is not."""
    if isinstance(value, str) and not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", value):
        return f"{vt.shown(value)} is not a catalog key"
    try:
        models.resolve(value)
    except models.UnknownModel as exc:
        text = str(exc)  # "model kv_heads 0 must be at least 1": the key is named by _check
        return text[len("model "):] if text.startswith("model ") else f"is refused: {text}"
    return None


def _no_credentials(url, where: str) -> str | None:
    """A URL that lands in a 0644 unit, a docker argv, daemon.json or a warning: no user:pass@."""
    if isinstance(url, str) and "@" in url.split("://", 1)[-1].split("/", 1)[0]:
        return (f"carries credentials (user:pass@ in {url.split('://', 1)[0]}://...@...): they would be readable in "
                f"a 0644 file, on a command line and in docker inspect; {where}")
    return None


def _driver_packages(value) -> str | None:
    """Package names in which `{branch}` is the one format field (str.format would raise on `{`
    or `{x}`, and `{branch.upper}` reads an attribute)."""
    for name in value or []:
        if re.sub(r"\{branch\}", "", name).count("{") or re.sub(r"\{branch\}", "", name).count("}"):
            return f"entry {vt.shown(name)} may use {{branch}} and no other braces"
    return None


# ---------------------------------------------------------------------------- the settings
#
# `Settings` is declared key by key: the attribute's type is what the rest of nemofleet reads (nested
# values as models of their own, secrets as `secret.Secret`, lists as tuples, mappings as
# `valuetypes.FrozenMap`), and `key(...)` beside it holds what host data may give (its raw types,
# default, pattern, range, choices, extra check) and its line of the settings reference. `parse()`
# is the only way to a Settings: every raw value is checked for its form (one sentence per bad key),
# then typed, so nothing after the edge reads a raw value or checks it again.


class _Typed(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True, strict=True, extra="forbid", arbitrary_types_allowed=True)


class Frontend(_Typed):
    """One entry of `frontends`: a Docker network a frontend (Open-WebUI, Dify) is on."""
    network: str
    name: Optional[str] = None
    alias: Optional[str] = None
    create: bool = False


class GatewayBackend(_Typed):
    """One entry of `gateway_backends`: a model endpoint the gateway balances over."""
    host: str
    port: int
    name: str  # host:port when the entry names none


class SeedPeer(_Typed):
    """A peer of `weights_seed_from`: a host to copy weights from before the mirror."""
    host: str
    user: Optional[str] = None
    port: Optional[int] = None
    key: Optional[str] = None
    wait: Optional[int] = None
    start: Optional[int] = None
    held: Optional[bool] = None

    def as_dict(self) -> dict:
        """The peer as the weights operation and the fan-out's --data take it (unset fields left out)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


_S, _I, _F, _B, _D, _L, _N = str, int, float, bool, dict, list, type(None)


def key(types: tuple[type, ...], default: Any, doc: str, section: str, **rules: Any) -> Any:
    """A settings attribute: its raw form (a `Key`, completed with its name below) and its doc."""
    return pydantic.Field(default=None, description=doc,
                          json_schema_extra=cast(Any, {"nemofleet": Key("", types, default, doc, section, **rules)}))


class Settings(_Typed):
    """Validated host data: every key as a typed attribute (`s.port_base`); `parse()` makes one."""

    # --- what to serve
    # resolved once here (models.resolve): every reader takes the typed Model, its `given` the form written
    model: models.Model = key((_S, _D), "nemotron-3.5-lightning-nvfp4",
        "catalog key (`nemofleet models`) or mapping {catalog|repo, revision, ...}; pin revision to a commit",
        "model", check=_model)
    vllm_image: str = key((_S,), DEFAULT_IMAGE, "vLLM image reference (tag decides the flag table)", "model",
        pattern=IMAGE)
    # --- added for the plan's third pass (issue 40 point 5) ---
    vllm_image_cuda: Optional[str] = key((_S, _N), None, "CUDA version the vLLM image needs (e.g. 13.0), where neither the "
        "image's own NVIDIA_REQUIRE_CUDA nor nemofleet's version table gives it", "model", pattern=r"^\d{1,2}\.\d$")
    # --- end of the plan's third pass block ---
    vllm_image_archive: Optional[str] = key((_S, _N), None, "`docker save` archive on the controller to load instead of pulling",
        "model", pattern=HOME_PATH)
    vllm_image_archives: vt.FrozenMap = key((_D,), {}, "{image reference: archive path} for air-gapped hosts", "model",
        check=_str_map("image", IMAGE, HOME_PATH))
    image_registry_rewrite: vt.FrozenMap = key((_D,), {}, "{prefix: replacement} for registries Docker's mirrors do not cover",
        "model", check=_str_map("prefix", r"[a-z0-9][a-z0-9._/:-]*", r"[a-z0-9][a-z0-9._/:-]*"))
    models_root: str = key((_S,), "/srv/nemofleet/models", "weights directory on the host (the fleet seed key may read "
        "all of it: never / or a system directory)", "model", pattern=ABS_PATH, check=vt.managed_dir_problem)
    # --- serving plan
    max_model_len: Optional[int] = key((_I, _N), None, "context length (default: the model's default context)", "serving",
        minimum=1, maximum=2**27)
    max_num_seqs: Optional[int] = key((_I, _N), None, "concurrent sequences per instance (default per GPU architecture)",
        "serving", minimum=1, maximum=65536)
    max_num_batched_tokens: Optional[int] = key((_I, _N), None, "tokens per batch (default per GPU architecture)", "serving",
        minimum=1, maximum=2**27)
    gpu_memory_utilization: float = key((_F, _I), 0.90, "fraction of each GPU's memory vLLM may use", "serving",
        minimum=0.01, maximum=1.0)
    tensor_parallel_size: Optional[int] = key((_I, _N), None, "GPUs per instance (default: chosen by tensor_parallel_policy)", "serving",
        minimum=1, maximum=1024)
    instances: Optional[int] = key((_I, _N), None, "vLLM instances on the host (default: GPUs / TP)", "serving", minimum=1,
        maximum=1024)
    tensor_parallel_policy: str = key((_S,), "recipe",
        "TP when tensor_parallel_size is unset: recipe (the model's, docs/recipes.md) | smallest (most instances) "
        "| largest (one instance over the GPUs)", "serving", choices=("recipe", "smallest", "largest"))
    gpus: Optional[tuple[Union[int, str], ...]] = key((_L, _N), None, "GPUs to serve on, by index or UUID (default: every GPU without MIG)", "serving",
        check=_gpu_refs)
    speculative: Optional[str] = key((_S, _N), None, "mtp | dflash | dspark | none (default: the model's)", "serving",
        choices=("mtp", "dflash", "dspark", "none", ""))
    num_speculative_tokens: Optional[int] = key((_I, _N), None, "speculative tokens (default: the model's)", "serving",
        minimum=1, maximum=16)
    kv_cache_dtype: Optional[str] = key((_S, _N), None, "KV cache dtype (default: the checkpoint's)", "serving",
        pattern=r"[a-z0-9_]+")
    # --- added for the seed recipes (issue 37 points 6 and 9, issue 40 point 7) ---
    recipe_flags: bool = key((_B,), True, "emit the recipe rows of docs/recipes.md for the model and GPU (false: only "
        "the flags the plan owns and vllm_extra_args, as a published line that sets none of them)", "serving")
    # --- end of the seed recipes block ---
    vllm_extra_args: vt.FrozenMap = key((_D,), {}, "extra vLLM flags {flag: value|true}, checked against the pinned version",
        "serving", check=_flag_map)
    instance_extra_args: vt.FrozenMap = key((_D,), {}, "extra flags per instance {instance: {flag: value|true}}", "serving",
        check=_instance_flags)
    port_base: int = key((_I,), 8000, "first host port (one per instance)", "serving", minimum=1, maximum=65535)
    bind_address: str = key((_S,), "127.0.0.1", "address the ports are published on", "serving", check=vt.ip_problem)
    instance_prefix: str = key((_S,), "nemotron-", "container name prefix", "serving", pattern=r"[a-z0-9][a-z0-9_.-]{0,30}")
    drain_seconds: int = key((_I,), 30, "vLLM --shutdown-timeout: seconds in-flight requests get on stop", "serving",
        minimum=0, maximum=3600)
    start_timeout: int = key((_I,), 1800, "systemd TimeoutStartSec of a vLLM unit", "serving", minimum=60,
        maximum=86400)
    ready_timeout: int = key((_I,), 1200, "seconds the deploy waits for /health after a (re)start", "serving",
        minimum=1, maximum=86400)
    wait_ready: bool = key((_B,), True, "wait for (re)started instances to be ready", "serving")
    # --- GPU access
    gpu_selection: str = key((_S,), "auto", "auto (CDI when usable) | cdi | gpus", "gpu", choices=("auto", "cdi", "gpus"))
    nvml_remedy: str = key((_S,), "cdi", "NVML 'Unknown Error' remedy: cdi | cgroupfs | none", "gpu",
        choices=("cdi", "cgroupfs", "none"))
    nvidia_dev_char_rule: bool = key((_B,), True, "install the /dev/char udev rule for NVIDIA devices", "gpu")
    # --- secrets and Hugging Face
    vllm_api_key: Optional[Secret] = key((_S, _N), None, "API key for /v1 (prefer vllm_api_key_file)", "secrets", secret=True,
        pattern=r"[\x21-\x7e]{8,512}")
    vllm_api_key_file: Optional[str] = key((_S, _N), "~/.config/nemofleet/api-key", "file on the controller holding the API key",
        "secrets", pattern=HOME_PATH)
    hf_token: Optional[Secret] = key((_S, _N), None, "Hugging Face token for gated repos (prefer hf_token_file)", "secrets",
        secret=True, pattern=r"[\x21-\x7e]{4,512}")
    hf_token_file: Optional[str] = key((_S, _N), "~/.config/nemofleet/hf-token", "file on the controller holding the HF token",
        "secrets", pattern=HOME_PATH)
    hf_endpoint: Optional[str] = key((_S, _N), None, "Hugging Face mirror URL (HF_ENDPOINT); none: huggingface.co", "weights",
        pattern=SAFE_URL, check=lambda v: _no_credentials(v, "give the mirror a token in hf_token_file instead "
                                                             "(sent as a Bearer header from a 0600 file)"))
    weights_verify: str = key((_S,), "marker", "marker (header check once, then the marker) | full (every run)",
        "weights", choices=("marker", "full"))
    weights_keep_revisions: int = key((_I,), 2,
        "weights directories kept per repo: 2 = this release's and the one before (for rollback)", "weights",
        minimum=1, maximum=2)
    weights_seed_from: Union[SeedPeer, tuple[SeedPeer, ...], None] = key((_S, _D, _L, _N), None, "peer host (or list, tried in order) to copy weights from "
        "before the mirror; unset: the fleet fan-out chooses (docs/fanout.md)", "weights", check=_seed)
    weights_fanout: bool = key((_B,), True, "in a converge or rollout of several hosts, fetch each model from the origin once and "
        "copy it from host to host (needs the fleet seed key; docs/fanout.md)", "weights")
    weights_peer_address: Optional[str] = key((_S, _N), None, "name or address other hosts reach this host's sshd at for a "
        "weights copy (none: its ssh_hostname unless a loopback one, else the inventory name)", "weights",
        pattern=HOSTNAME)
    weights_peer_bwlimit: Union[str, int, None] = key((_S, _I, _N), None, "rsync --bwlimit of a weights copy from a peer (KiB/s, or "
        "with a K/M/G suffix, e.g. 200M), so a serving source is not starved; none: unbounded", "weights",
        pattern=r"[1-9][0-9]{0,8}[KMG]?", minimum=1, maximum=999_999_999)
    weights_seed_key: Optional[Secret] = key((_S, _N), None, "private key for peer seeding (prefer weights_seed_key_file)",
        "weights", secret=True, multiline=True, check=_pem_key)
    weights_seed_key_file: Optional[str] = key((_S, _N), None, "file on the controller: private key for peer seeding", "weights",
        pattern=HOME_PATH)
    weights_seed_public_key_file: Optional[str] = key((_S, _N), None, "its public key (exactly one), authorised read-only on every "
        "host", "weights", pattern=HOME_PATH)
    weights_seed_networks: tuple[str, ...] = key((_L,), ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fd00::/8"],
        "networks (CIDR) the fleet seed key is accepted from (authorized_keys from=; default: the private ranges)",
        "weights", check=lambda v: _networks(v) or (None if v else "must list at least one network"))
    # --- Docker daemon.json and proxies
    docker_default_runtime: Optional[str] = key((_S, _N), None, "daemon.json default-runtime (e.g. nvidia)", "docker",
        pattern=r"[a-z0-9][a-z0-9_.-]*")
    docker_registry_mirrors: Optional[tuple[str, ...]] = key((_L, _N), None, "daemon.json registry-mirrors (Docker Hub only)", "docker",
        pattern=SAFE_URL, check=lambda v: next(filter(None, (_no_credentials(u, "log dockerd in with `docker login` "
                                                                                "instead") for u in v or [])), None))
    docker_insecure_registries: Optional[tuple[str, ...]] = key((_L, _N), None, "daemon.json insecure-registries (host:port or CIDR)",
        "docker", pattern=r"[A-Za-z0-9.:/\[\]-]+")
    docker_log_driver: Optional[str] = key((_S, _N), "json-file", "daemon.json log-driver (none: leave as is)", "docker",
        check=lambda v: None if v is None or v in LOG_DRIVERS else
        f"{vt.shown(v)} is not one of Docker's log drivers ({', '.join(LOG_DRIVERS)}); dockerd would refuse to start")
    docker_log_opts: Optional[vt.FrozenMap] = key((_D, _N), {"max-size": "100m", "max-file": "3"},
        "daemon.json log-opts, string values (none: leave as is)", "docker")
    docker_exec_opts: Optional[tuple[str, ...]] = key((_L, _N), None, "daemon.json exec-opts (none: nemofleet decides for the NVML trap)",
        "docker", pattern=r"[a-z.]+=[A-Za-z0-9_.-]+")
    http_proxy: Optional[str] = key((_S, _N), None, "proxy for dockerd (image pulls)", "docker", pattern=SAFE_URL)
    https_proxy: Optional[str] = key((_S, _N), None, "HTTPS proxy for dockerd", "docker", pattern=SAFE_URL)
    no_proxy: Optional[str] = key((_S, _N), None, "hosts dockerd reaches directly", "docker", pattern=NO_PROXY)
    # --- frontends
    frontends: tuple[Frontend, ...] = key((_L,), [], "Docker networks of the frontends [{name, network, alias, create}]; the "
        "instances join them, or with a front door the frontends reach it",
        "frontends", check=_frontends)
    # --- front door
    front_door: Optional[bool] = key((_B, _N), None, "one HAProxy endpoint per host in front of the instances "
        "(none: on when the host has more than one instance)", "front_door")
    front_door_port: int = key((_I,), 8800, "port of the front door (on 127.0.0.1 and front_door_address)", "front_door",
        minimum=1, maximum=65535)
    front_door_address: Optional[str] = key((_S, _N), None, "address the front door also listens on for containers (none: "
        "the Docker bridge gateway, what host-gateway resolves to)", "front_door", check=vt.ip_problem)
    front_door_timeout: int = key((_I,), 3600, "seconds a request (a long streamed generation) may last at the front door "
        "(and at the gateway)", "front_door", minimum=30, maximum=86400)
    # --- multi-node serving groups (one model over several hosts on vLLM's own distributed runtime)
    serving_group: Optional[str] = key((_S, _N), None, "the multi-node serving group this host is a member of (the inventory's "
        "serving_groups fills it; none: the host serves on its own)", "multinode", pattern=GROUP_NAME)
    serving_group_members: Optional[tuple[str, ...]] = key((_L, _N), None, "the group's hosts in rank order, the head first (the inventory's "
        "serving_groups fills it)", "multinode", check=_members)
    serving_group_parallel: str = key((_S,), "pp", "how the group splits the model: pp (TP = GPUs per host, PP = hosts, "
        "vLLM's advice) | tp (TP over every GPU of the group) | dp (one replica per TP group, one API on the head)",
        "multinode", choices=("pp", "tp", "dp"))
    serving_group_master_port: int = key((_I,), 29501, "the head's rendezvous port (vLLM --master-port)", "multinode",
        minimum=1024, maximum=65535)
    serving_group_dp_rpc_port: int = key((_I,), 13345, "the head's data-parallel RPC port (vLLM --data-parallel-rpc-port)",
        "multinode", minimum=1024, maximum=65535)
    serving_group_interface: Optional[str] = key((_S, _N), None, "the NIC group traffic uses (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME; "
        "none: the interface whose address is in serving_group_network)", "multinode", pattern=r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}")
    serving_group_network: tuple[str, ...] = key((_L,), ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fd00::/8"],
        "the private networks group traffic may use (vLLM's inter-node traffic is not encrypted)", "multinode",
        check=_networks)
    serving_group_allow_public: bool = key((_B,), False, "allow a rendezvous address outside serving_group_network",
        "multinode")
    serving_group_ib_hca: Optional[str] = key((_S, _N), None, "NCCL_IB_HCA: the InfiniBand/RoCE adapters NCCL uses (none: NCCL's choice)",
        "multinode", pattern=r"\^?=?[A-Za-z0-9_:,.-]{1,200}")
    serving_group_join_timeout: int = key((_I,), 600, "seconds a worker waits for the head's rendezvous port before it fails",
        "multinode", minimum=10, maximum=86400)
    # --- fleet gateway (deploys/gateway.py, hosts of the inventory group `gateway`)
    gateway_backends: tuple[GatewayBackend, ...] = key((_L,), [], "the model endpoints a gateway host balances over [{host, port, name}]: "
        "each GPU host's front door (front_door_port) or, with one instance, its instance port", "gateway",
        check=_gateway_backends)
    gateway_port: int = key((_I,), 8800, "port of the gateway's one endpoint", "gateway", minimum=1, maximum=65535)
    gateway_address: str = key((_S,), "0.0.0.0", "address the gateway listens on (0.0.0.0: every address)", "gateway",
        check=vt.ip_problem)
    gateway_fall: int = key((_I,), 3, "failed /health checks (2 s apart) before the gateway ejects a backend",
        "gateway", minimum=1, maximum=100)
    gateway_rise: int = key((_I,), 2, "passed /health checks before an ejected backend takes requests again",
        "gateway", minimum=1, maximum=100)
    # --- health
    health_schedule: str = key((_S,), "* * * * *", "cron schedule of the health check", "health", pattern=CRON,
        check=vt.cron_problem)
    health_check_infer: bool = key((_B,), False, "also run a tiny inference probe", "health")
    health_fail_restart: int = key((_I,), 0, "restart an instance after N consecutive failures (0: off)", "health",
        minimum=0, maximum=100)
    health_restart_grace: int = key((_I,), 1200,
        "no self-heal restart of an instance not yet healthy since its start, for N s (it is loading)",
        "health", minimum=0, maximum=86400)
    health_restarts_per_hour: int = key((_I,), 3, "cap on self-heal restarts per instance per hour", "health",
        minimum=0, maximum=60)
    health_webhook_url: Optional[Secret] = key((_S, _N), None, "webhook called on state changes (kept in a 0600 file)", "health",
        secret=True, pattern=SAFE_URL)
    prom_dir: str = key((_S,), "/var/lib/prometheus/node-exporter", "node_exporter textfile directory", "health",
        pattern=ABS_PATH, check=vt.managed_dir_problem)
    expected_host_key: Optional[str] = key((_S, _N), None,
        "SSH host key fingerprint `nemofleet rebuild` expects of the reinstalled host (SHA256:...)", "fleet",
        pattern=r"SHA256:[A-Za-z0-9+/]{43}")
    # --- opt-in installs
    install_container_toolkit: bool = key((_B,), False, "install the NVIDIA Container Toolkit (pinned, held)",
        "bootstrap")
    container_toolkit_version: Optional[str] = key((_S, _N), None, "toolkit version to pin, e.g. 1.18.0-1", "bootstrap",
        check=lambda v: None if v is None or re.fullmatch(r"([0-9]+:)?[0-9][A-Za-z0-9.+~-]*", v) else
        f"must be a pinned package version such as '1.18.0-1' (got {vt.shown(v)})")
    container_toolkit_repo: Optional[str] = key((_S, _N), NVIDIA_TOOLKIT_REPO, "toolkit apt repository", "bootstrap",
        pattern=r"https?://[A-Za-z0-9.:\[\]-]+(/[A-Za-z0-9._~+=:@/$()-]*)?")
    container_toolkit_key_file: Optional[str] = key((_S, _N), None, "the repository's signing key (file on the controller)",
        "bootstrap", pattern=HOME_PATH)
    install_nvidia_driver: bool = key((_B,), False, "install the NVIDIA driver branch (pinned, held, reboot)",
        "bootstrap")
    nvidia_driver_branch: Optional[str] = key((_S, _I, _N), None, "driver branch, e.g. 580", "bootstrap", pattern=r"[0-9]{3}",
        minimum=100, maximum=999)
    nvidia_driver_packages: Optional[tuple[str, ...]] = key((_L, _N), None, "driver packages ({branch} expands)", "bootstrap",
        pattern=r"[a-z0-9][a-z0-9.+{}-]*", check=_driver_packages)
    nvidia_driver_repo: Optional[str] = key((_S, _N), None, "flat apt repository of the driver (none: the host's sources)",
        "bootstrap", pattern=r"https?://[A-Za-z0-9.:\[\]-]+(/[A-Za-z0-9._~+=:@/$()-]*)?")
    nvidia_driver_key_file: Optional[str] = key((_S, _N), None, "its signing key (file on the controller)", "bootstrap",
        pattern=HOME_PATH)
    # issue 50: one signed bundle for air-gapped fleets (nemofleet bundle; docs/air-gap.md)
    bundle: Optional[str] = key((_S, _N), None, "signed bundle on the controller the deploy takes every image, "
        "weight and package from (nothing from a registry, mirror or repository)", "bootstrap", pattern=HOME_PATH)
    bundle_hf_endpoint: Optional[str] = key((_S, _N), None, "Hub or mirror the controller fetches weights from for "
        "`nemofleet bundle create` (none: hf_endpoint)", "bootstrap", pattern=SAFE_URL)
    bundle_apt_repo: Optional[str] = key((_S, _N), None, "flat apt repository the controller fetches the toolkit's "
        ".deb files from for `nemofleet bundle create` (none: container_toolkit_repo)", "bootstrap",
        pattern=r"https?://[A-Za-z0-9.:\[\]-]+(/[A-Za-z0-9._~+=:@/$()-]*)?")
    bundle_signing_key_file: Optional[str] = key((_S, _N), None, "SSH private key (controller) `nemofleet bundle "
        "create` signs the manifest with (ssh-keygen -Y sign)", "bootstrap", pattern=HOME_PATH)
    bundle_allowed_signers_file: Optional[str] = key((_S, _N), None, "ssh-keygen allowed_signers file (controller) a "
        "bundle's signer must be in (none: ~/.config/nemofleet/allowed_signers)", "bootstrap", pattern=HOME_PATH)


    def replace(self, **changes: Any) -> "Settings":
        """A copy with some values changed: the planner's what-ifs (a lower memory utilisation, no
        TP given). The values are the planner's own typed ones, not host data."""
        return self.model_copy(update=changes)

    def __repr__(self) -> str:  # secrets are Secret: shown as <secret>
        return "Settings(" + ", ".join(f"{k}={vt.shown(v)}" for k, v in self) + ")"

    __str__ = __repr__


KEYS: list[Key] = [dataclasses.replace(cast(dict, field.json_schema_extra)["nemofleet"], name=name)
                   for name, field in Settings.model_fields.items()]
BY_NAME: dict[str, Key] = {k.name: k for k in KEYS}


def _typed(key: Key, value):
    """A checked raw value -> its typed form (nested models, Secret, tuples)."""
    if value is None:
        return None
    if key.secret:
        return Secret(value)
    if key.name == "frontends":
        return tuple(Frontend(**{k: v for k, v in f.items() if v is not None}) for f in value)  # unset: the default
    if key.name == "gateway_backends":
        return tuple(GatewayBackend(host=b["host"], port=b["port"], name=b.get("name") or f"{b['host']}:{b['port']}")
                     for b in value)
    if key.name == "weights_seed_from":
        peer = lambda v: SeedPeer(**({"host": v} if isinstance(v, str) else v))  # noqa: E731
        return tuple(peer(v) for v in value) if isinstance(value, list) else peer(value)
    if key.name == "model":
        return models.resolve(value)
    if key.name == "nvidia_driver_branch":
        return str(value)  # --data 580 arrives as a number
    if key.name == "speculative" and value == "":
        return "none"
    return vt.frozen(value)  # lists as tuples, mappings as FrozenMaps, all the way down


@functools.cache
def pyinfra_keys() -> frozenset[str]:
    """Host-data keys pyinfra itself reads: every connector's data_meta (ssh_*, docker_identifier...)."""
    names: set[str] = set()
    try:
        from importlib.metadata import entry_points

        for ep in entry_points(group="pyinfra.connectors"):
            try:
                names.update(getattr(ep.load(), "data_meta", {}) or {})
            except Exception:  # a broken third-party connector must not break validation
                continue
    except Exception:
        pass
    return frozenset(names)


# the longest one-line value any setting holds (an image reference, a URL, a no_proxy list...): longer
# is a paste gone wrong, never a plan, and it would be echoed into units and files; a PEM key may be
# longer
MAX_TEXT = 4096
MAX_PEM = 65536


def _check(key: Key, value) -> str | None:
    if value is None and type(None) in key.types:
        return None
    if (isinstance(value, bool) and bool not in key.types) or not isinstance(value, key.types):
        # a secret (or a URL, which may hold credentials) of the wrong type is named by its type
        # alone: the value may still be the secret
        hide = key.secret or key.pattern == SAFE_URL
        return f"{key.name} ({key.doc}) must be a {key.type_name()}, not {vt.kind(value) if hide else vt.shown(value)}"
    if key.choices is not None and value not in key.choices:
        shown = [str(c) for c in key.choices if c]
        return f"{key.name} {vt.shown(value)} is unknown; use {', '.join(shown[:-1])} or {shown[-1]}"
    if isinstance(value, float) and not vt.is_number(value):
        return f"{key.name} {vt.shown(value)} is not a finite number"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if key.minimum is not None and value < key.minimum:
            return f"{key.name} {vt.shown(value)} must be at least {key.minimum:g}"
        if key.maximum is not None and value > key.maximum:
            return f"{key.name} {vt.shown(value)} must be at most {key.maximum:g}"
    if isinstance(value, list) and key.pattern and not all(isinstance(i, str) for i in value):
        return f"{key.name} must be a list of strings ({key.doc}), not {vt.shown(value)}"
    items = value if isinstance(value, list) else [value] if isinstance(value, (str, int)) else []
    for item in items:
        text = str(item) if isinstance(item, str) else vt.shown(item)
        if len(text) > (MAX_PEM if key.multiline else MAX_TEXT):
            # longer values were accepted before the settings were typed (migration wording)
            use = ("domain suffixes (.example.com) and CIDR ranges instead of host names" if key.name == "no_proxy"
                   else "a shorter value")
            return (f"{key.name} is {len(text)} characters long: now refused because a value of it is at most "
                    f"{MAX_PEM if key.multiline else MAX_TEXT} characters (one line of a unit or config file); "
                    f"use {use}")
        if vt.CONTROL.search(text.replace("\n", "") if key.multiline else text):
            return f"{key.name} has a control character (newline, tab...) in {'its value' if key.secret else vt.shown(text)}"
        if key.pattern == SAFE_URL and "://" not in text and not key.secret:
            # shown as the URL it should be, so that its credentials (user:password@) are hidden too
            return f"{key.name}: {vt.shown('https://' + text)[9:-1]} needs a scheme, e.g. {vt.shown('https://' + text)[1:-1]}"
        if key.pattern and not re.fullmatch(key.pattern, text):
            what = "its value" if key.secret else vt.shown(text)
            return f"{key.name} {what} is not valid here ({key.doc}; expected {key.pattern})"
    if key.check is not None:
        why = key.check(value)
        if why:
            return f"{key.name} {why}"
    return None


# pyinfra's own secret host data (connector passwords, the sudo/su password argument)
PYINFRA_SECRET_KEYS = ("ssh_password", "ssh_key_password", "_sudo_password", "_su_password", "winrm_password")


def command_line_secret(name, value=None) -> str | None:
    """One sentence when `--data NAME=VALUE` would put a secret on a command line (readable in
    `ps` and shell history): a secret key, pyinfra's passwords, or a value holding URL credentials
    (a proxy's user:password@), naming what to use instead; None otherwise. The value is never
    part of the sentence."""
    if not isinstance(name, str):
        return None
    if isinstance(value, str) and vt.has_credentials(value):
        return (f"--data {name}=... holds URL credentials (user:password@), which would be on pyinfra's command "
                f"line (readable in ps); set {name} in the inventory's group data (a file) instead")
    if name in BY_NAME and BY_NAME[name].secret:
        instead = (f"set {name}_file (a 0600 file on the controller) in group data instead" if f"{name}_file" in BY_NAME
                   else "set it in group data (or the file setting of the same name) instead")
        return f"--data {name}=... would put a secret on pyinfra's command line (readable in ps); {instead}"
    if name in PYINFRA_SECRET_KEYS or (re.search(r"pass(word|wd)|secret|token", name, re.I)
                                       and not name.endswith("_file")):
        return (f"--data {name}=... would put a password on pyinfra's command line (readable in ps); use an SSH key "
                "or agent, or set it in the inventory's host data")
    return None


def parse(data: dict) -> Settings:
    """Host data -> Settings (defaults filled in). Raises SettingsError with one sentence per bad key."""
    problems = []
    out: dict = {}
    if not isinstance(data, dict):
        raise SettingsError([f"host data must be a mapping of setting names to values, not {type(data).__name__}"])
    odd = [k for k in data if not isinstance(k, str)]
    if odd:
        raise SettingsError([f"setting names must be strings; {vt.shown(odd[0])} ({type(odd[0]).__name__}) is not one"])
    for name in sorted(data):
        # keys nemofleet does not own but accepts: pyinfra's global arguments (_sudo, ...) and
        # connector data (ssh_user, ...)
        if name not in BY_NAME and not name.startswith("_") and name not in pyinfra_keys():
            close = difflib.get_close_matches(name, list(BY_NAME), n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else "; `nemofleet settings` lists every key"
            problems.append(f"unknown setting {vt.shown(name)}{hint}")
    for key in KEYS:
        value = data[key.name] if key.name in data else key.default
        try:
            why = _check(key, value)
        except RecursionError:
            why = f"{key.name} is nested too deeply"
        if why:
            problems.append(why)
        else:
            out[key.name] = value
    if problems:
        raise SettingsError(problems)
    typed = {}
    for key in KEYS:
        try:
            typed[key.name] = _typed(key, out[key.name])
        except (pydantic.ValidationError, TypeError, ValueError, KeyError, RecursionError) as exc:
            # a value the sentences above let through but its type does not take: named, never raised
            problems.append(f"{key.name} has a value of a shape nemofleet cannot use ({type(exc).__name__}): "
                            f"{vt.kind(out[key.name]) if key.secret else vt.shown(out[key.name])}; "
                            "`nemofleet settings` shows its type")
    if problems:
        raise SettingsError(problems)
    try:
        return Settings(**typed)
    except (pydantic.ValidationError, TypeError, ValueError, KeyError) as exc:
        # a value the sentences above let through but the type does not take: named, never raised
        where = exc.errors()[0]["loc"] if isinstance(exc, pydantic.ValidationError) else ()
        name = where[0] if where else "a setting"
        raise SettingsError([f"{name} has a value of a shape nemofleet cannot use ({type(exc).__name__}); "
                             f"`nemofleet settings` shows its type"]) from None


def defaults() -> Settings:
    return parse({})


def markdown_table() -> str:
    """The settings table of docs/settings.md (generated; a test keeps the page equal to it)."""
    rows = ["| key | type | default | what |", "|---|---|---|---|"]
    for key in KEYS:
        default = "" if key.default is None else f"`{key.default!r}`".replace("|", "\\|")
        rows.append(f"| `{key.name}` | {key.type_name()} | {default} | {key.doc.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def text_table() -> str:
    out = []
    section = None
    for key in KEYS:
        if key.section != section:
            section = key.section
            out.append(f"[{section}]")
        out.append(f"  {key.name:<30} {key.type_name():<20} default {key.default!r}")
        out.append(f"      {key.doc}")
    return "\n".join(out) + "\n"


def write_reference(path: str = "docs/settings.md") -> bool:
    """Replace the generated settings table of the settings reference (between its markers); True if
    it changed."""
    import pathlib

    p = pathlib.Path(path)
    text = p.read_text()
    begin, end = "<!-- settings:begin -->\n", "<!-- settings:end -->"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    new = head + begin + markdown_table() + end + tail
    if new != text:
        p.write_text(new)
    return new != text


def rewrite_image(image: str, rewrites: dict | None) -> str:
    """The image name the host pulls once `image_registry_rewrite` applies. Registry mirrors only
    apply to Docker Hub (moby#18818): other registries are reached through a rewritten name,
    e.g. {"nvcr.io/": "registry.internal/nvcr/"}."""
    for prefix, replacement in (rewrites or {}).items():
        if image.startswith(prefix):
            return replacement + image[len(prefix):]
    return image
