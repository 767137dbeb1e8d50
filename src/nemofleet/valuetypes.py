"""Value types that know their range: each `*_problem(value)` returns None for a value of the
type, or the end of one sentence saying why not (the caller names the key).

Parse, don't validate: settings.py, models.py and the fact parsers call these once, at the edge,
and everything above them reads values that already have the type. Nothing here imports the
rest of nemofleet (it sits below settings, models and facts).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import math
import re
from collections.abc import Mapping
from typing import Any, Callable, Literal, overload

# No control characters anywhere (a newline in a value could add a cron line, a unit directive
# or an env-file variable); printable text only.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class FrozenMap(dict):
    """A mapping nobody can change (`m["x"] = 1` raises TypeError): the typed settings' mappings
    (vllm_extra_args, docker_log_opts...) and the mappings inside them, so a value checked at the
    edge stays the value that was checked. A dict for every reader (json.dumps, isinstance, `**`)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a setting's mapping is immutable: build a new one ({**m, key: value})")

    __setitem__ = __delitem__ = __ior__ = _refuse
    update = pop = popitem = setdefault = clear = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted((k, repr(v)) for k, v in self.items())))

    def __copy__(self) -> "FrozenMap":
        return self

    def __deepcopy__(self, memo: dict) -> "FrozenMap":
        return self

    def __reduce__(self) -> Any:
        return (FrozenMap, (dict(self),))


class Refusal(str):
    """A sentence that refuses a host, with a stable code beside it ("driver", "disk", "api-key",
    "settings"...): tests and `nemofleet plan --json` match the code, so the prose may be reworded.
    A str for every reader; a sentence made without one has the code "refused"."""

    code: str

    def __new__(cls, sentence: str, code: str = "refused") -> "Refusal":
        self = super().__new__(cls, sentence)
        self.code = code
        return self

    def __reduce__(self) -> Any:
        return (Refusal, (str(self), self.code))


def coded(code: str, sentences) -> list[str]:
    """These sentences as Refusals with this code (one that has its own code keeps it)."""
    return [s if isinstance(s, Refusal) else Refusal(s, code) for s in sentences]


def code_of(sentence: str) -> str:
    """The code of a refusal ("refused" for a plain sentence)."""
    return getattr(sentence, "code", "refused")


def frozen(value: Any) -> Any:
    """A checked raw value with every mapping a FrozenMap and every list a tuple, all the way down."""
    if isinstance(value, Mapping):
        return FrozenMap({k: frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


def thawed(value: Any) -> Any:
    """frozen()'s inverse, for a reader that walks plain dicts and lists (models.resolve)."""
    if isinstance(value, Mapping):
        return {k: thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thawed(v) for v in value]
    return value

# The largest integer any setting or model figure may hold: beyond shell arithmetic's 2**63 and
# systemd's usec counters, a value is a typo, never a plan.
INT_MAX = 2**53


# A value as a message shows it: repr() shortened to SHOWN characters (a 20,000-character string or
# a nested list is named, not echoed), and a number too long for repr() (int > 4300 digits raises
# ValueError) described by its size; a value nested past the recursion limit is not shown either.
SHOWN = 60


# The credentials of a URL (`scheme://user:password@host`, or `user:password@host` written without
# its scheme), wherever one stands in a shown value: each word (a run between blanks, quotes,
# brackets and commas) is looked at once, so a 20,000-character value costs linear time.
_WORD = re.compile(r"[^\s'\"\[\](),]+")


def _hide_userinfo(word: str) -> str:
    if "@" not in word:
        return word
    scheme, sep, rest = word.partition("://")
    if not sep:
        scheme, rest = "", word
    host_part = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" not in host_part:
        return word
    userinfo = host_part.rsplit("@", 1)[0]  # up to the last @: a password may hold one
    if not sep and ":" not in userinfo:
        return word  # an e-mail address, not a URL's credentials
    return f"{scheme}{sep}***@{rest[len(userinfo) + 1:]}"


def hide_credentials(text: str) -> str:
    return _WORD.sub(lambda m: _hide_userinfo(m.group(0)), text)


def printable(text, keep: str = "") -> str:
    """Text read back from a host (a lock holder, a unit name, a status line) as it may enter a
    sentence or a terminal: every character str.isprintable() refuses (the C0 and C1 controls, ESC
    that starts a terminal's escape sequence, the line breaks U+0085, U+2028 and U+2029, the bidi
    controls and every other format character) written as its escape (\\x1b, \\u2028); the
    rest, and the characters of `keep`, as they are. No quotes, no truncation."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def shown(value, limit: int = SHOWN) -> str:
    """The one way a value enters a sentence: repr() (control characters, escape sequences,
    Unicode line separators and bidi controls escaped, whatever the value's own repr wrote: see
    printable), a URL's credentials replaced by `***`, shortened; a secret
    (nemofleet.secret.Secret) shows as <secret> by its own repr."""
    try:
        text = printable(repr(value))
    except ValueError:  # an int beyond sys.get_int_max_str_digits()
        return f"a number of about {int(abs(value).bit_length() * 0.30103) + 1} digits" if is_int(value) else "a value"
    except RecursionError:
        return "a value nested too deeply to show"
    text = hide_credentials(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def has_credentials(text: str) -> bool:
    """Whether a text holds a URL's credentials (user:password@ or user@ after a scheme)."""
    return hide_credentials(text) != text


def kind(value) -> str:
    """A value's type in words ("a list", "bytes"), for a sentence that must not show the value."""
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", bytes: "bytes",
             list: "a list", tuple: "a list", dict: "a mapping", type(None): "null"}
    return next((w for t, w in names.items() if type(value) is t), f"a {type(value).__name__}")


def is_int(value) -> bool:
    """An integer that is not a bool (True is an int to Python, never to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite int or float that is not a bool: NaN and inf pass every `<` and `>` check, so they
    are refused here, once."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float (10**400): no number a float can hold
        return False


# ---------------------------------------------------------------------------- what a host printed
# Every number and time a host prints is read here, once: text of ASCII digits (str.isdigit() and
# int() also take '²' and Arabic-Indic digits; float() takes '1e309', 'inf' and 'nan'), bounded.

UNIX_MAX = 2**40  # a unix time (year 36812): no clock a host can have is beyond it; gmtime() holds it
_HOST_INT = re.compile(r"-?[0-9]{1,18}")
_HOST_DECIMAL = re.compile(r"-?[0-9]{1,18}(\.[0-9]{1,18})?([eE][-+]?[0-9]{1,3})?")


class Unreadable(ValueError):
    """A host printed something nemofleet cannot read, or did not answer: one sentence. `value`
    is what the reader reports on its own for that case (a fact's fallback)."""

    def __init__(self, sentence: str, value=None):
        super().__init__(sentence)
        self.value = value


@overload
def host_number(text: Any, minimum: int = 0, maximum: int = INT_MAX, decimal: Literal[False] = False) -> int | None: ...
@overload
def host_number(text: Any, minimum: int = 0, maximum: int = INT_MAX, *, decimal: Literal[True]) -> int | float | None: ...


def host_number(text, minimum: int = 0, maximum: int = INT_MAX, decimal: bool = False) -> int | float | None:
    """A number a host printed, or None: ASCII digits with an optional '-' (a fraction and an
    exponent only where `decimal`: '%g' prints 1.2e-05), from `minimum` to `maximum`. Anything
    else (another type, '1e309', 'inf', 'nan', '²', '٣', 5000 digits, a number out of range) is
    None: the caller says what it is not."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not (_HOST_DECIMAL if decimal else _HOST_INT).fullmatch(text):
        return None
    value = float(text) if decimal else int(text)
    return value if minimum <= value <= maximum else None


def host_time(value) -> int | None:
    """A unix time in whole seconds as a host gives it (ASCII digits, or an int already read),
    0 <= t < UNIX_MAX; None for anything else (a time nobody can hold, text, a float)."""
    if is_int(value):
        return value if 0 <= value < UNIX_MAX else None
    return host_number(value, 0, UNIX_MAX - 1)


def reads_host(fallback):
    """The one wrapper of a controller-side reader of a remote program's answer that is no fact
    (facts/__init__.py has the facts'): whatever the reader raises on an answer it did not
    foresee becomes `fallback(sentence, *args)`, that reader's value for "this host's answer is
    unreadable", never a traceback. The reader itself is `__wrapped__` (the hostile suite feeds
    it the 25 classes of bad lines and asserts it never needs this)."""
    def wrap(read):
        @functools.wraps(read)
        def total(*args, **kwargs):
            try:
                return read(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - an answer the reader did not foresee: this host only
                return fallback(f"nemofleet cannot read the host's answer ({read.__name__}: {type(exc).__name__})",
                                *args, **kwargs)
        return total
    return wrap


def key_values(lines, prefix: str = "") -> dict[str, str]:
    """`key=value` lines (those that start with `prefix`, which is dropped) -> {key: value}, each
    stripped; other lines are ignored."""
    out = {}
    for line in lines:
        if line.startswith(prefix):
            key, sep, value = line[len(prefix):].partition("=")
            if sep:
                out[key.strip()] = value.strip()
    return out


def host_json(text: str):
    """JSON a host printed, as dockerd's Go parser reads it: NaN, Infinity and a number beyond
    any float (1e309) are no JSON, nor is nesting deeper than a parser holds. ValueError with the
    reason otherwise (json.loads takes all of them)."""
    def refused(what):
        raise ValueError(f"{what} is not a JSON number")

    def number(digits):
        value = float(digits)
        return value if math.isfinite(value) else refused(digits[:20])

    try:
        return json.loads(text, parse_constant=refused, parse_float=number)
    except RecursionError:
        raise ValueError("nested deeper than a JSON parser holds") from None


def flag_value_problem(value) -> str | None:
    """A value a program's flag gets (vllm_extra_args): every number in it finite and at most
    INT_MAX in size, whether it is a number, a number written as text ('1e999', 'inf', which vLLM's
    float() reads) or one inside JSON text it holds (vLLM reads --hf-overrides, --speculative-config
    and the like with json.loads, which takes 1e999 and NaN); text that opens as JSON must be JSON."""
    given = value
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        try:
            value = host_json(value)
        except ValueError as exc:
            return f"holds JSON text vLLM cannot read ({exc})"
    elif isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None  # no number
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (dict, list)):
            stack.extend(v.values() if isinstance(v, dict) else v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and not (is_number(v) and abs(v) <= INT_MAX):
            return f"has the number {shown(given if isinstance(given, str) else v)}: numbers are finite and at most {INT_MAX}"
    return None


def int_problem(value, minimum: int | None = None, maximum: int | None = None) -> str | None:
    if not is_int(value):
        return f"must be an integer, not {shown(value)}"
    if minimum is not None and value < minimum:
        return f"{shown(value)} must be at least {minimum}"
    if value > (INT_MAX if maximum is None else maximum):
        return f"{shown(value)} must be at most {INT_MAX if maximum is None else maximum}"
    return None


def number_problem(value, minimum: float | None = None, maximum: float | None = None) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, not {shown(value)}"
    if not is_number(value):
        return f"{shown(value)} is not a finite number"
    if minimum is not None and value < minimum:
        return f"{shown(value)} must be at least {minimum:g}"
    if maximum is not None and value > maximum:
        return f"{shown(value)} must be at most {maximum:g}"
    return None


def port_problem(value) -> str | None:
    if not is_int(value) or not 0 < value < 65536:
        return f"{shown(value)} is not a TCP port (1-65535)"
    return None


def text_problem(value) -> str | None:
    """A one-line string (no control character: a newline would start a new cron line, unit
    directive, HAProxy statement or env-file variable)."""
    if not isinstance(value, str):
        return f"must be a string, not {shown(value)}"
    if CONTROL.search(value):
        return f"{shown(value)} has a control character (newline, tab...)"
    return None


# ---------------------------------------------------------------------------- addresses


def ip_problem(value) -> str | None:
    """An IPv4 or IPv6 address without a scope id: Python's ipaddress accepts `fe80::1%<any text
    but / and %>`, and that text would reach a URL, a docker -p or an HAProxy line."""
    if not isinstance(value, str):
        return f"{shown(value)} is not an IP address (e.g. 127.0.0.1, 0.0.0.0 or ::1)"
    if "%" in value:
        return f"{shown(value)} has an IPv6 scope id (%...); give the address alone"
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return f"{shown(value)} is not an IP address (e.g. 127.0.0.1, 0.0.0.0 or ::1)"
    return None


# A scope id as a host may report it in `ip -o addr` (fe80::1%eth0): an interface name or a
# number. Only fact addresses may carry one, and it never reaches a command line: the serving
# group's member address drops it (multinode.member_address), settings refuse it (ip_problem).
_SCOPE_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def fact_ip_problem(value) -> str | None:
    """An address as a host reports it (a fact): IPv4, or IPv6 with an optional scope id of
    letters, digits, '_', '.', '-'. What a compromised host could put after '%' (`$(id)`, a
    quote, a slash) is refused here, at the edge, before any decision reads it."""
    if not isinstance(value, str) or len(value) > 128:
        return f"{shown(value)} is not an IP address"
    addr, sep, scope = value.partition("%")
    if sep and not _SCOPE_ID.fullmatch(scope):
        return f"{shown(value)} has a scope id that is not an interface name or number"
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        return f"{shown(value)} is not an IP address"
    return None


# nvidia-smi's formats (../shared/captures/h200/nvidia-smi-q.txt, tests/fixtures/gpu/h200/):
# GPU-52f85421-656d-13c5-c3e9-04deeba4a042 and 00000000:00:06.0. A UUID reaches `docker run
# --gpus device=...` and unit files: anything else (a ',' would add a --gpus option) is refused.
GPU_UUID = re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
PCI_BUS_ID = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")


# a network interface name as the kernel allows it (IFNAMSIZ: 15 characters, no '/' or space);
# it reaches NCCL_SOCKET_IFNAME in a unit file
INTERFACE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}")


def _shaped(pattern: re.Pattern, what: str) -> Callable[[Any], str | None]:
    """The `*_problem` of a string of one shape: None when `pattern` matches all of it, else
    "<value> is not <what>"."""
    def problem(value) -> str | None:
        return None if isinstance(value, str) and pattern.fullmatch(value) else f"{shown(value)} is not {what}"
    return problem


interface_problem = _shaped(INTERFACE, "a network interface name")
gpu_uuid_problem = _shaped(GPU_UUID, "a GPU UUID as nvidia-smi prints it (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
bus_id_problem = _shaped(PCI_BUS_ID, "a PCI bus id as nvidia-smi prints it (00000000:19:00.0)")


_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
DNS_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")


def host_problem(value) -> str | None:
    """An IP address (no scope id) or a DNS host name (RFC 1123 labels, 253 characters at most)."""
    if isinstance(value, str) and ip_problem(value) is None:
        return None
    if isinstance(value, str) and "%" not in value and len(value) <= 253 and DNS_NAME.fullmatch(value):
        return None
    return f"{shown(value)} is not an IP address or a host name"


def network_problem(value) -> str | None:
    if not isinstance(value, str) or "%" in value:
        return f"{shown(value)} is not a network in CIDR form (e.g. 10.0.0.0/8)"
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return f"{shown(value)} is not a network in CIDR form (e.g. 10.0.0.0/8)"
    return None


# ---------------------------------------------------------------------------- paths

# Directories of the system: a directory nemofleet writes into or serves (models_root: the fleet
# seed key's read-only rsync serves all of it; prom_dir) may be none of these nor lie below the
# ones marked with a slash (the kernel's, the configuration's, the boot loader's).
SYSTEM_DIRS = ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
               "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/bin",
               "/usr/lib", "/usr/local", "/usr/sbin", "/usr/share", "/var", "/var/lib", "/var/log", "/var/run",
               "/var/tmp", "/var/lib/docker")
SYSTEM_TREES = ("/bin/", "/boot/", "/dev/", "/etc/", "/lib/", "/lib32/", "/lib64/", "/proc/", "/root/", "/run/",
                "/sbin/", "/sys/", "/usr/bin/", "/usr/lib/", "/usr/sbin/", "/var/lib/docker/")
_PATH = re.compile(r"/[A-Za-z0-9._/+@-]*")


def managed_dir_problem(value) -> str | None:
    """An absolute, normalised directory that nemofleet may own on a host: no '..', '.', '//' or
    trailing '/', not the root or a system directory, not inside the system's own trees."""
    if not isinstance(value, str) or not _PATH.fullmatch(value) or len(value) > 4096:
        return f"{shown(value)} must be an absolute path of letters, digits and ._+@- (e.g. /srv/nemofleet/models)"
    parts = value.split("/")[1:]
    if value != "/" and (value.endswith("/") or any(p in ("", ".", "..") for p in parts)):
        return f"{shown(value)} must be a normalised path (no '..', '.', '//' or trailing '/')"
    if value in SYSTEM_DIRS:
        # accepted before the settings were typed (migration: say why it changed and what to use)
        return (f"{shown(value)} is a system directory: now refused because nemofleet would write into it or serve "
                "all of it to the fleet's seed key; use a directory of its own (the default, or e.g. /srv/nemofleet/...)")
    if any(value.startswith(tree) for tree in SYSTEM_TREES):
        return (f"{shown(value)} lies inside the system's own tree {shown(value.split('/')[1])}: now refused because "
                "nemofleet would write there; use a directory of its own")
    return None


# ---------------------------------------------------------------------------- cron

# (name, lowest, highest) of the five fields of a crontab(5) schedule; weekday 7 is Sunday too
CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12),
               ("day of week", 0, 7))
CRON_KEYWORDS = ("@hourly", "@daily", "@weekly", "@monthly")
_CRON_ITEM = re.compile(r"(\*|(\d+)(?:-(\d+))?)(?:/(\d+))?")


def cron_problem(value) -> str | None:
    """A schedule cron runs: five fields, each a comma list of `*`, `N` or `N-M`, optionally `/S`,
    every number inside its field's range and every step at least 1 (cron skips a line with
    `99 99 99 99 99` or `*/0` in it: a health check that never runs)."""
    if not isinstance(value, str):
        return f"must be a cron schedule string, not {shown(value)}"
    if value in CRON_KEYWORDS:
        return None
    fields = value.split(" ")
    if len(fields) != 5:
        return (f"{shown(value)} is not a cron schedule: five fields separated by one space "
                f"(minute hour day-of-month month day-of-week) or one of {', '.join(CRON_KEYWORDS)}")
    for text, (name, low, high) in zip(fields, CRON_FIELDS):
        for item in text.split(","):
            m = _CRON_ITEM.fullmatch(item)
            if not m:
                return f"{shown(value)}: {name} field {shown(text)} is not `*`, N, N-M or either with /STEP"
            a, b, step = m.group(2), m.group(3), m.group(4)
            for n in (a, b):
                if n is not None and not low <= int(n) <= high:
                    return f"{shown(value)}: {name} {int(n)} is outside {low}-{high}"
            if a is not None and b is not None and int(a) > int(b):
                return f"{shown(value)}: {name} range {a}-{b} runs backwards"
            if step is not None and not 1 <= int(step) <= high:
                return f"{shown(value)}: {name} step /{int(step)} must be from 1 to {high}"
    return None


# ---------------------------------------------------------------------------- Hub names

# huggingface_hub's own rule for repo ids (utils/_validators.py, validate_repo_id): `org/name`,
# letters, digits, `-`, `_`, `.`; neither `--` nor `..`; no leading or trailing `-` or `.`;
# 96 characters at most.
_HUB_PART = r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?"
REPO_ID = re.compile(rf"{_HUB_PART}/{_HUB_PART}")


def repo_problem(value) -> str | None:
    if not isinstance(value, str) or not REPO_ID.fullmatch(value) or "--" in value or ".." in value \
            or len(value) > 96:
        return (f"{shown(value)} is not a Hugging Face repo id (org/name: letters, digits, '-', '_', '.', "
                "no '--' or '..', at most 96 characters)")
    return None


_REF_PART = r"[A-Za-z0-9_+-]([A-Za-z0-9_.+-]*[A-Za-z0-9_+-])?"
REVISION = re.compile(rf"{_REF_PART}(/{_REF_PART})*")


def revision_problem(value) -> str | None:
    """A branch, tag or commit as git names them (git-check-ref-format(1), narrowed): components of
    letters, digits, `_ + - .` joined by single `/`; no `..`, no leading `/`, `-` or `.`, no
    `.lock` ending, no control character; 255 characters at most."""
    if (not isinstance(value, str) or not REVISION.fullmatch(value) or ".." in value or value.startswith("-")
            or value.endswith(".lock") or len(value) > 255):
        return (f"{shown(value)} is not a branch, tag or commit (letters, digits, '_', '+', '-', '.' in parts "
                "joined by '/'; no '..', no leading '/' or '-')")
    return None


# One file name in a directory: no `/`, not `.` or `..`, no leading `-` or `.`.
file_name_problem = _shaped(re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}"),
                            "a plain file name (letters, digits, '_', '.', '+', '-')")
