"""The serving plan's data model: GPUs, instances, a serving group member's role, departures from
the published recipes, mounts and the Plan itself (what the deploy renders and `nemofleet plan` prints).
No decision is made here: plan.py and multinode.py make plans; render.py and desired.py read them.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from . import models as catalog
from .memory import Memory


GIB = 1024**3
MIB = 1024**2
CONTAINER_PORT = 8000
TP_SIZES = (1, 2, 4, 8)
INSTANCE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,40}$")



class PlanError(ValueError):
    """One sentence saying why this host cannot serve what the inventory asks for."""


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    cc: str
    mig: str = "Disabled"
    persistence: str = "Enabled"
    bus_id: str = ""
    # the GPU shares the system memory (GB10, Jetson Thor: nvidia-smi prints memory.total [N/A]);
    # memory_mib is then the MemTotal vLLM sees there (docs/recipes.md#unified-memory)
    unified: bool = False


@dataclass
class Instance:
    name: str  # container name; unit is nemofleet-vllm-<name>.service
    gpus: list[Gpu]
    host_port: int
    tp: int
    ep: bool
    args: list[str]  # everything after the image name (model path first)
    memory: Memory
    max_model_len: int
    max_num_seqs: int
    arch: str = ""
    gpu_label: str = ""  # "H100 80 GiB"
    group: "GroupRole | None" = None  # this host's part of a multi-node serving group (multinode.py)

    @property
    def unit(self) -> str:
        return f"nemofleet-vllm-{self.name}.service"

    @property
    def gpu_uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus]


@dataclass(frozen=True)
class GroupRole:
    """A host's part in a multi-node serving group: one model over several hosts (multinode.py)."""
    name: str
    members: tuple[str, ...]  # rank order, the head first
    rank: int
    parallel: str  # pp | tp | dp
    head_address: str
    address: str  # this member's address on the group network
    interface: str
    port: int  # the head's rendezvous port: --master-port, or --data-parallel-rpc-port with dp
    join_timeout: int

    @property
    def head(self) -> bool:
        return self.rank == 0

    @property
    def role(self) -> str:
        return "head" if self.head else "worker"

    def to_dict(self) -> dict:
        return {"name": self.name, "members": list(self.members), "rank": self.rank, "role": self.role,
                "parallel": self.parallel, "head_address": self.head_address, "address": self.address,
                "interface": self.interface, "port": self.port}


@dataclass(frozen=True)
class Departure:
    """One place where the planned line departs from the published command it follows
    (docs/recipes.md#departures). `text` is the `departure:` line (what, why, and the setting that
    restores the recipe's way, or that none can); `flags` the flags (or config keys,
    "--speculative-config.num_speculative_tokens") it names; `restore` the host settings that give
    the published command's flags back (the text names them), None where no setting can."""
    text: str
    flags: tuple[str, ...]
    restore: dict | None


@dataclass
class Mount:
    host: str
    container: str


@dataclass
class Plan:
    host: str
    model: catalog.Model
    image: str
    vllm_version: str
    instances: list[Instance]
    gpu_method: str  # cdi | gpus
    mounts: list[Mount]
    downloads: list[dict]  # {repo, revision, dir}
    env: dict[str, str]
    bind_address: str
    served_name: str
    warnings: list[str] = field(default_factory=list)
    docker_exec_opts: list[str] | None = None  # daemon.json exec-opts the plan needs
    choices: list[str] = field(default_factory=list)  # why this TP / instance count, per GPU model
    excluded_gpus: list[int] = field(default_factory=list)  # MIG-enabled, not selected, or idle
    # each departure from the published recipe the plan follows: what, why, and the setting
    # that restores the recipe's way (docs/recipes.md)
    departures: list[str] = field(default_factory=list)
    departed: list[Departure] = field(default_factory=list)  # the same, with their flags and settings

    def to_dict(self) -> dict:
        return {
            "host": self.host,
            "model": self.model.key,
            "repo": self.model.repo,
            "revision": self.model.revision,
            "image": self.image,
            "vllm_version": self.vllm_version,
            "gpu_method": self.gpu_method,
            "served_name": self.served_name,
            "warnings": self.warnings,
            "choices": self.choices,
            "departures": self.departures,
            "excluded_gpus": self.excluded_gpus,
            "instances": [
                {
                    "name": i.name, "unit": i.unit, "gpus": [g.index for g in i.gpus],
                    "gpu_uuids": i.gpu_uuids, "gpu_model": i.gpu_label, "arch": i.arch,
                    "port": i.host_port, "tp": i.tp, "ep": i.ep,
                    "max_model_len": i.max_model_len, "max_num_seqs": i.max_num_seqs,
                    "memory_need_bytes": i.memory.need, "memory_available_bytes": i.memory.available,
                    "full_context_seqs": i.memory.full_context_seqs, "memory": i.memory.to_dict(),
                    "args": i.args, **({"group": i.group.to_dict()} if i.group else {}),
                }
                for i in self.instances
            ],
        }




def gpus_from_facts(rows) -> list[Gpu]:
    """The planner's GPUs from the typed facts' rows (factmodel.Gpu): the fields nvidia-smi
    reported, the planner's defaults for the rest."""
    names = {f.name for f in dataclasses.fields(Gpu)}
    return [Gpu(**{k: getattr(r, k) for k in r.model_fields_set if k in names}) for r in rows]
