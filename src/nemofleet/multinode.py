"""Multi-node serving groups: one model over several hosts, on vLLM's own distributed runtime.

A pure part of the serving plan (desired.for_host calls `make_group_plan` for a host whose
settings name a `serving_group`; it starts and finishes the plan as plan.make_plan does). Every member plans the same group from the same inputs -- the group's settings
and every member's facts -- and takes its own rank's part, so the members cannot disagree.

What a group runs (docs/recipes.md#multi-node has the sources):
- pp (default): TP = the GPUs of one host, PP = the hosts; vLLM's multiprocessing executor across
  nodes: `--nnodes N --node-rank R --master-addr HEAD --master-port P`, `--headless` on all but
  the head. vLLM's own advice for a model larger than one node.
- tp: TP over every GPU of the group (same flags, no PP); only sensible over InfiniBand/NVLink.
- dp: one replica per TP group of one host's GPUs, all behind the head's API:
  `--data-parallel-size D --data-parallel-size-local L --data-parallel-address HEAD
  --data-parallel-rpc-port P`, `--headless --data-parallel-start-rank R*L` on the others.
The containers run with `--network host` (NCCL and the rendezvous need the host's addresses),
NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME/VLLM_HOST_IP name the group's interface and address.
"""

from __future__ import annotations

from collections.abc import Mapping

import ipaddress
import re

from . import gpus as gpu_table
from . import memory as mem_model
from .factmodel import Facts, Health, ModelDir, PeerMissing
from .layout import Ctx, NoFit, fit_layout, memory_for, planned_flags, try_fit, viable
from .plan import finish, instance, start
from .plan_types import GIB, MIB, Gpu, GroupRole, Plan, PlanError, gpus_from_facts

# Interfaces that never carry group traffic: loopback and container/overlay plumbing.
_PLUMBING = re.compile(r"^(lo|docker\d*|docker_gwbridge|br-.*|veth.*|virbr.*|cni.*|flannel.*|cali.*|vxlan.*|"
                       r"tun.*|tap.*|kube.*|weave.*|cilium.*)$")
MAX_NODES = 16


def head_probe(host: str, s, peers: dict | None) -> tuple[str, int] | None:
    """(head address, rendezvous port) a worker checks it can reach before anything changes, or
    None (not a worker, or the head's address cannot be known: the plan refuses that itself)."""
    members = s.serving_group_members or []
    if not s.serving_group or host not in members or host == members[0]:
        return None
    head = (peers or {}).get(members[0])
    if not isinstance(head, Facts):
        return None
    where = member_address(head.addresses, s)
    if isinstance(where, str):
        return None
    port = s.serving_group_dp_rpc_port if s.serving_group_parallel == "dp" else s.serving_group_master_port
    return where[1], port


def member_address(addresses: Mapping, s) -> tuple[str, str] | str:
    """(interface, address) this member uses for group traffic, or one sentence why none.
    An address inside serving_group_network on serving_group_interface (or on any interface that
    is not loopback or container plumbing); IPv4 before IPv6."""
    nets = [ipaddress.ip_network(n, strict=False) for n in s.serving_group_network]
    want = s.serving_group_interface
    found = []
    for iface, addrs in sorted((addresses or {}).items()):
        if (want and iface != want) or (not want and _PLUMBING.match(iface)):
            continue
        for a in addrs:
            # the facts' schema typed the address (factmodel.py); the scope id (fe80::1%eth0)
            # is dropped here, so what reaches the workers' units is the address alone
            try:
                ip = ipaddress.ip_address(str(a).partition("%")[0])
            except ValueError:
                continue
            if ip.is_loopback or ip.is_link_local or ip.is_multicast:
                continue
            found.append((not any(ip in n for n in nets), ip.version, iface, str(ip)))
    found.sort()
    if found and (not found[0][0] or s.serving_group_allow_public):
        return found[0][2], found[0][3]
    where = f"on {want}" if want else "on any interface"
    if found:
        return (f"its only address {where} is {found[0][3]}, outside serving_group_network "
                f"({', '.join(s.serving_group_network)}): vLLM's inter-node traffic is not encrypted, so "
                "nemofleet keeps it on a private network; add that network to serving_group_network, or set "
                "serving_group_allow_public: true if the link is trusted")
    if not addresses:  # e.g. a host without iproute2 (seen on a real H200 machine): `ip` is missing
        return "`ip -o addr` listed no address there (is iproute2 installed?); set serving_group_interface once it is"
    return f"it has no usable address {where} (interfaces: {', '.join(sorted(addresses))})"


def _member_gpus(name: str, facts: Facts, s) -> list[Gpu] | str:
    if not facts.gpus.gpus:
        return "nvidia-smi lists no GPU there"
    try:
        usable, _ = gpu_table.select(gpus_from_facts(facts.gpus.gpus), s.gpus)
    except gpu_table.UnsupportedGpu as exc:
        return str(exc)
    return usable or "none of its GPUs is usable (MIG enabled or not selected)"


def _shape(gpus: list[Gpu]) -> str:
    return f"{len(gpus)}x {gpu_table.label(gpus[0])}"


def make_group_plan(host: str, gpus: list[Gpu], data, *, docker_version: str | None = None,
                    cdi_available: bool = False, cgroup_version: int | None = None,
                    cgroup_driver: str | None = None, local_meta: ModelDir | None = None,
                    peers: dict | None = None, health: Health | None = None) -> Plan:
    """The plan of `host` as a member of its serving group; `peers`: {member: HostFacts} of every
    member (this host included); `health`: its GPU health fact (its admission sentences and warnings
    join the plan's; the group's shape itself comes from every member's GPUs in _member_gpus, where
    GPU health is not applied yet). Raises PlanError with one sentence."""
    s, ctx, _, warnings, _, _ = start(gpus, data, local_meta, health)
    name, members = s.serving_group or "", s.serving_group_members
    if not members:
        raise PlanError(f"serving_group {name} has no members: list its hosts, head first, in the inventory's "
                        f"serving_groups (serving_groups = {{{name!r}: ['head', 'worker', ...]}})")
    if host not in members:
        raise PlanError(f"this host is in serving_group {name} but not among its members ({', '.join(members)})")
    if len(members) > MAX_NODES:
        raise PlanError(f"serving_group {name} has {len(members)} members; nemofleet plans at most {MAX_NODES}")
    peers = peers or {}
    shapes, addrs, problems = {}, {}, []
    for member in members:
        f = peers.get(member)
        if f is None:
            problems.append(f"{member} is not part of this run (deploy every member of {name} together: "
                            f"--limit {','.join(members)})")
            continue
        if isinstance(f, PeerMissing):  # no facts, no answer, or facts not of their types (factmodel)
            problems.append(f"{member} {f.why}")
            continue
        unread = sorted(f.errors.items())
        if unread and member != host:  # this host's own unreadable parts are refused on their own
            problems.append(f"{member}: could not read {unread[0][0]} ({unread[0][1][:160]})")
            continue
        found = _member_gpus(member, f, s)
        if isinstance(found, str):
            problems.append(f"{member}: {found}")
            continue
        shapes[member] = found
        where = member_address(f.addresses, s)
        if isinstance(where, str):
            problems.append(f"{member}: {where}")
        else:
            addrs[member] = where
    if problems:
        raise PlanError(f"serving_group {name} cannot be planned: " + "; ".join(problems))
    head = members[0]
    for what, per, why in (
            ("GPUs", {m: _shape(g) for m, g in shapes.items()},
             "every member needs the same GPU model and count (one TP size, one memory budget)"),
            ("NVIDIA drivers", {m: peers[m].gpus.driver for m in members},
             "NCCL across the group needs one driver and CUDA version on every member")):
        if len(set(per.values())) > 1:
            raise PlanError(f"serving_group {name} mixes {what} ({', '.join(f'{m}: {per[m]}' for m in members)}): {why}")
    images = {m: (peers[m].image.id if peers[m].image is not None else None) or "" for m in members}
    pulled = {i for i in images.values() if i}
    if len(pulled) > 1:
        raise PlanError(f"serving_group {name}: {s.vllm_image} is a different image on "
                        f"{', '.join(m for m in members if images[m] and images[m] != images[head]) or 'a member'} "
                        "than on the head (re-pull it everywhere, or pin the image by digest)")
    reach = peers[host].head_reach
    if reach is not None and reach.state == "silent":
        raise PlanError(f"serving_group {name}: this host gets no answer from the head {head} at {reach.target} "
                        f"within 3 s (a firewall drops it, or there is no route): open TCP {reach.target.rpartition(':')[2]} "
                        "and NCCL's ports between the members (or set serving_group_interface to the network they share)")
    own = shapes[host]
    n_nodes, per_node = len(members), len(own)
    try:
        arch = gpu_table.arch_of(own[0])
    except gpu_table.UnsupportedGpu as exc:
        raise PlanError(str(exc)) from None
    m = ctx.model
    if arch.name not in m.archs:
        raise PlanError(f"{m.key} does not run on {arch.name} GPUs (supported: {', '.join(m.archs)})")
    mode = s.serving_group_parallel
    gpu_bytes = own[0].memory_mib * MIB
    seqs = s.max_num_seqs or arch.default_max_num_seqs
    batched = s.max_num_batched_tokens or arch.default_max_num_batched_tokens
    where = f"{n_nodes} hosts x {_shape(own)}"
    one_host = try_fit(ctx, own)
    rank = members.index(host)
    head_addr = addrs[head][1]
    # the head's rendezvous port, as head_probe checks it
    port = s.serving_group_dp_rpc_port if mode == "dp" else s.serving_group_master_port
    if mode == "dp":
        try:
            lay = fit_layout(ctx, own)
        except NoFit as nofit:
            raise PlanError(f"{m.key} does not fit one replica per host of serving_group {name} ({_shape(own)}: "
                            f"{nofit.mem.summary()} at TP{nofit.tp}); serving_group_parallel: pp spreads one "
                            "replica over the hosts") from None
        tp, pp, local = lay.tp, 1, lay.count
        mem, seqs, batched = lay.mem, lay.seqs, lay.batched
        more = [("--data-parallel-size", local * n_nodes), ("--data-parallel-size-local", local),
                ("--data-parallel-address", head_addr), ("--data-parallel-rpc-port", port)]
        if rank:
            more += [("--data-parallel-start-rank", rank * local), ("--headless", None)]
        choice = (f"serving_group {name} ({where}): data parallel, {local * n_nodes} replicas of TP{tp} "
                  f"({local} per host), one API on the head {head}; each fits with {mem.headroom / GIB:.1f} GiB "
                  f"headroom per GPU ({mem.summary()})")
    else:
        tp, pp = (per_node, n_nodes) if mode == "pp" else (per_node * n_nodes, 1)
        # one instance over the group whose TP the mode decides: a host's own TP or instance count
        # cannot apply here; refused rather than silently dropped
        shape = f"TP{tp} x PP{pp}" if pp > 1 else f"TP{tp}"
        if s.tensor_parallel_size not in (None, tp):
            raise PlanError(f"serving_group {name} ({where}) runs one instance of {shape} (serving_group_parallel "
                            f"{mode}), so tensor_parallel_size {s.tensor_parallel_size} cannot apply: remove it, "
                            "or set serving_group_parallel: dp for replicas of that TP on each host")
        if s.instances not in (None, 1):
            raise PlanError(f"serving_group {name} ({where}) runs one instance of {shape} across its hosts "
                            f"(serving_group_parallel {mode}), so instances {s.instances} cannot apply: remove it, "
                            "or set serving_group_parallel: dp for several replicas")
        mem = memory_for(ctx, planned_flags(ctx, arch, tp, seqs, batched), tp, gpu_bytes, seqs, batched, pp=pp)
        if not viable(ctx, mem, tp * pp, gpu_bytes):
            raise _group_refusal(ctx, name, where, own, arch, tp, pp, mem, seqs, batched)
        more = ([("--pipeline-parallel-size", pp)] if pp > 1 else []) + [
            ("--nnodes", n_nodes), ("--node-rank", rank), ("--master-addr", head_addr), ("--master-port", port)]
        if rank:
            more.append(("--headless", None))
        how = (f"TP{tp} within each host x PP{pp} across the hosts (vLLM's advice: TP = GPUs per node, PP = nodes)"
               if mode == "pp" else f"TP{tp} over every GPU of the group")
        choice = (f"serving_group {name} ({where}): one instance, {how}; fits with {mem.headroom / GIB:.1f} GiB "
                  f"headroom per GPU ({mem.summary()}) and its KV cache holds "
                  f"{mem_model.seqs_phrase(mem.full_context_seqs, ctx.mml)} at once")
    # the head serves the API on the host's network (--network host): bind_address and port_base
    more += [("--host", s.bind_address), ("--port", s.port_base)]
    role = GroupRole(name=name, members=tuple(members), rank=rank, parallel=mode, head_address=head_addr,
                     address=addrs[host][1], interface=addrs[host][0], port=port,
                     join_timeout=s.serving_group_join_timeout)
    choice += f"; this host is rank {rank} of {n_nodes} ({role.role}{', --headless' if rank else ''}), head {head} at {head_addr}:{port}"
    if reach:
        choice += f" (reachable from here: {reach.state})"
    inst = instance(ctx, f"{s.instance_prefix}{name}", own, s.port_base, arch, tp, seqs, batched, more, mem, role)
    if one_host and mode != "dp":
        warnings.append(f"{m.key} fits one host of serving_group {name} ({one_host.count} x TP{one_host.tp} on "
                        f"{_shape(own)}, {one_host.mem.summary()}): spreading it over "
                        f"{n_nodes} hosts adds inter-node traffic to every token; serve it per host unless "
                        "the group is wanted (longer context, fewer endpoints)")
    no_rdma = [mb for mb in members if not peers[mb].rdma]
    if no_rdma:
        warnings.append(f"no InfiniBand/RoCE adapter on {', '.join(no_rdma)} (/sys/class/infiniband is empty): "
                        f"NCCL sends serving_group {name}'s traffic over TCP sockets on {addrs[host][0]}, "
                        "far slower than RDMA for TP/PP across hosts")
    if rank == 0:
        warnings.append(f"serving_group {name}: vLLM's inter-node traffic is not encrypted; it stays on "
                        f"{', '.join(f'{mb} {addrs[mb][1]}' for mb in members)}")
    env = {"NCCL_SOCKET_IFNAME": addrs[host][0], "GLOO_SOCKET_IFNAME": addrs[host][0],
           "VLLM_HOST_IP": addrs[host][1]}
    if s.serving_group_ib_hca:
        env["NCCL_IB_HCA"] = s.serving_group_ib_hca
    return finish(host, s, ctx, gpus, [inst], [choice], warnings, env, docker_version, cdi_available,
                  cgroup_version, cgroup_driver)


def _group_refusal(ctx: Ctx, name: str, where: str, gpus: list[Gpu], arch, tp: int, pp: int, mem, seqs,
                   batched) -> PlanError:
    """Need vs available per GPU, and the smallest group of these hosts that would hold it."""
    m, s = ctx.model, ctx.s
    gpu_bytes, per_node, bigger = gpus[0].memory_mib * MIB, len(gpus), None
    for n in range(2, MAX_NODES + 1):
        t, p = (per_node, n) if s.serving_group_parallel == "pp" else (per_node * n, 1)
        alt = memory_for(ctx, planned_flags(ctx, arch, t, seqs, batched), t, gpu_bytes, seqs, batched, pp=p)
        if viable(ctx, alt, t * p, gpu_bytes):
            bigger = f"{n} hosts of {_shape(gpus)} ({alt.summary()})"
            break
    floor = f" and {m.min_total_bytes / GIB:.0f} GiB in all" if m.min_total_bytes else ""
    return PlanError(
        f"{m.key} over serving_group {name} ({where}, TP{tp} x PP{pp}) needs {mem_model.gib(mem.need)} per GPU{floor} "
        f"({mem.terms()}) but each GPU has {mem_model.gib(mem.available)} at gpu_memory_utilization "
        f"{float(s.gpu_memory_utilization):.2f}; "
        + (f"it fits {bigger}" if bigger else f"no group of up to {MAX_NODES} such hosts holds it")
        + " (or lower max_model_len / max_num_seqs)")
