"""Host-level facts (cgroup, OS, disk) and HostFacts, which runs every host fact in one command."""

from __future__ import annotations

from .. import shell  # the one quoting boundary

from pyinfra.api.exceptions import FactProcessError

from . import PARTS, Fact
from ..factmodel import Facts, part_problem

from ..settings import BY_NAME, DEFAULT_IMAGE
from ..valuetypes import host_number, key_values
from . import docker, weights  # noqa: F401  (imported for the parts their facts declare)
from ..lock import fact as _lock_fact  # noqa: F401  (the lock's part: its fact lives in the lock package)
from .gpu import TIMED_OUT
from .gpuhealth import SMI_HUNG
from . import engine


class CgroupVersion(Fact, part="cgroup"):
    """1 or 2, from the filesystem type of /sys/fs/cgroup (cgroups(7): cgroup2fs is v2)."""

    def command(self) -> str:
        return "stat -fc %T /sys/fs/cgroup/ 2>/dev/null || true"

    def parse(self, output):
        kind = (output[0] if output else "").strip()
        return 2 if kind == "cgroup2fs" else 1 if kind == "tmpfs" else None


class OsRelease(Fact, part="os"):
    """/etc/os-release as a dict."""

    def command(self) -> str:
        return "cat /etc/os-release 2>/dev/null || true"

    def parse(self, output):
        return {key: value.strip('"') for key, value in key_values(output).items()}


DISK_TIMEOUT = 20  # seconds for df and the models listing on a (possibly network) filesystem


class FreeDisk(Fact, part="disk_free", reads={"path": "models_root"}):
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""

    def command(self, path: str) -> str:
        # bounded: a hung NFS models root must not hang the run (no output: the size is unknown)
        script = ('p=$1; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
                  "df -PB1 \"$p\" | awk 'NR==2{print $4}'")
        return f"timeout {DISK_TIMEOUT} sh -c {shell.quote(script)} sh {shell.quote(path)}"

    def parse(self, output):
        return host_number(output[0], 0, 2**62)


class Release(Fact, part="release"):
    """The release the host serves (/var/lib/nemofleet/release): {"id", "image", "model"} or None."""

    def command(self) -> str:
        return "cat /var/lib/nemofleet/release 2>/dev/null || true"

    def parse(self, output):
        return key_values(output) or None


class GpuAccessRecord(Fact, part="gpu_access"):
    """The signature of the GPU access setup that last passed the daemon-reload probe, or None."""

    def command(self) -> str:
        return "cat /var/lib/nemofleet/gpu-access 2>/dev/null || true"

    def parse(self, output):
        return "\n".join(output).strip() or None


class RdmaDevices(Fact, part="rdma"):
    """InfiniBand/RoCE adapters (/sys/class/infiniband): NCCL uses RDMA across hosts when there is
    one, TCP sockets otherwise (a serving group warns about the latter)."""

    def command(self) -> str:
        return "ls /sys/class/infiniband 2>/dev/null || true"

    def parse(self, output):
        return sorted(w for line in output for w in line.split() if w)


class HostFacts(Fact):
    """Everything preflight and the serving plan need, in one remote command.

    Each part is the command of the fact named in PARTS, so `pyinfra INV fact` on a single
    fact and this combined fact always agree (and are tested with the same fixtures).
    """

    # every part a fact declares (Fact's `part=`), in the order of factmodel.Facts' fields: nvidia-smi
    # first (its output is kept for the health part's check of a hung nvidia-smi)
    PARTS = {k: PARTS[k] for k in Facts.model_fields if k in PARTS}
    MARK = "@@nemofleet-fact:"
    ENGINE = "engine"  # the section of the Docker parts' shared read

    ARGS = ("models_root", "image")

    def _parts(self, args):
        for key, (cls, kwargs) in self.PARTS.items():
            kw = {k: (args[v] if v in self.ARGS else v) for k, v in kwargs.items()}
            yield key, cls(), kw

    def command(self, models_root: str = BY_NAME["models_root"].default, image: str = DEFAULT_IMAGE) -> str:
        parts = list(self._parts({"models_root": models_root, "image": image}))
        # the Docker parts share one read of the engine (facts/engine.py), in a section of its own
        read, shared = engine.shared([(fact, kw) for _, fact, kw in parts])
        chunks = [f"echo '{self.MARK}{self.ENGINE}'; ( {read} ) 2>/dev/null"] if read else []
        for (key, _, _), cmd in zip(parts, shared):
            if key == "gpus":  # kept in $g: a wedged nvidia-smi is not waited for a second time below
                chunks.append(f"echo '{self.MARK}{key}'; g=$( ( {cmd} ) 2>/dev/null ); printf '%s\\n' \"$g\"")
            elif key == "health":
                chunks.append(f"echo '{self.MARK}{key}'; case \"$g\" in *RC={TIMED_OUT}*) echo {SMI_HUNG} ;; "
                              f"*) ( {cmd} ) 2>/dev/null ;; esac")
            else:
                chunks.append(f"echo '{self.MARK}{key}'; ( {cmd} ) 2>/dev/null")
        return "; ".join(chunks) + "; true"

    def parse(self, output):
        """{part: value, ..., "errors": {part: sentence}}. A part whose output cannot be read (or
        whose tool did not answer in time) never raises: it gets its fact's own value for that
        case (Unreadable.value) or its default, and one sentence in `errors`, so only this host
        is refused and the run goes on for the others."""
        sections: dict[str, list[str]] = {}
        twice: set[str] = set()
        current = None
        for line in output:
            if line.startswith(self.MARK):
                current = line[len(self.MARK):].strip()
                if current in sections:  # a file or log line the host printed holds the marker
                    twice.add(current)
                sections[current] = []
            elif current is not None:
                sections[current].append(line)
        out: dict = {}
        errors: dict[str, str] = {}
        read = sections.get(self.ENGINE) or []
        for key, fact, _ in self._parts(dict.fromkeys(self.ARGS, "")):
            if twice & {key, self.ENGINE if isinstance(fact, engine.EngineFact) else key}:
                out[key], why = fact.default(), (f"the host printed the {key} part twice (a file or a log line there "
                                                 f"holds nemofleet's marker {self.MARK}); nemofleet reads neither")
            else:
                out[key], why = read_part(key, fact, engine.lines_for(fact, sections.get(key) or [], read))
            if why:
                errors[key] = why
        out["errors"] = errors
        return out


def known_reads(facts: dict, models_root: str, image: str) -> list[tuple]:
    """(fact class, kwargs, value) of what HostFacts already read, as the deploy's operations ask
    for it: the batch of the same run (facts/prefetch.py) then does not read daemon.json, the
    image or a verified weights marker a second time. Parts that could not be read are left out."""
    from .weights import WeightsStatus, status_from_models

    errors = facts.get("errors") or {}
    out = []
    for key, fact, kw in HostFacts()._parts({"models_root": models_root, "image": image}):
        if key in facts and key not in errors:
            out.append((type(fact), kw, facts[key]))
    if "models" not in errors:
        for name, meta in sorted((facts.get("models") or {}).items()):
            known = status_from_models(models_root, name, meta)
            if known:
                out.append((WeightsStatus, *known))
    return out


def facts_file_problem(host: str, facts) -> str | None:
    """One sentence when a facts file's entry for `host` is not a whole HostFacts of the declared
    types (factmodel.py), None when it is."""
    if not isinstance(facts, dict):
        return f"the facts file's entry for {host} is not an object of HostFacts parts"
    for key in (*HostFacts.PARTS, "errors"):
        why = part_problem(key, facts[key]) if key in facts else None
        if why:
            return f"the facts file's entry for {host} is not what HostFacts writes: {why}"
    # the release, GPU-access record, lock and addresses only matter to a deploy, never to a plan;
    # a facts file written before the health part existed plans as if every GPU were healthy
    missing = [k for k in HostFacts.PARTS
               if k not in facts and k not in ("release", "gpu_access", "lock", "addresses", "rdma", "health")]
    if missing:
        return (f"the facts file's entry for {host} lacks {', '.join(missing)}: write it with "
                "`pyinfra INVENTORY --json fact nemofleet.facts.host.HostFacts`")
    return None


def read_part(key: str, fact: Fact, lines: list[str]):
    """(value, None) or (fallback value, sentence) for one HostFacts part: the fact's own reading
    (Fact.read_output: never a traceback) and the part's declared type (factmodel.py)."""
    try:
        value, why = fact.read_output(lines)
    except FactProcessError as exc:
        return fact.default(), str(exc)
    if why is None and part_problem(key, value):
        return fact.default(), f"the {key} check printed a value nemofleet cannot use: {part_problem(key, value)}"
    return value, why
