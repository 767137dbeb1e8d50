"""The local testbed of simulated GPU hosts (started by `nemofleet testbed up` / `make demo`).

Hosts are reached over real SSH on 127.0.0.1 only, with the key generated for this testbed.
Deliberately broken hosts join only when NEMOFLEET_TESTBED_BROKEN=1 (the tests do that), the
gateway host (group gateway, deploys/gateway.py) only when NEMOFLEET_TESTBED_GATEWAY=1, the
members of a multi-node serving group (mn-1, mn-2) only when named in NEMOFLEET_TESTBED_HOSTS.
NEMOFLEET_TESTBED_HOSTS=a,b limits the inventory to those hosts.
"""
import os

try:
    from nemofleet_testbed import container, groupdata, read_state, testbed_dir
except ModuleNotFoundError as _exc:  # the testbed is its own package (testbed/), not in nemofleet's wheel
    if _exc.name != "nemofleet_testbed":
        raise
    raise SystemExit("the testbed inventory needs the nemofleet-testbed package, which is not installed here: "
                     "in a nemofleet checkout run `make venv` (or `pip install -e ./testbed`)") from None

_state = read_state()
if not _state.get("hosts"):
    raise SystemExit("the nemofleet testbed is not up: run `make demo` or `nemofleet testbed up` first")

_only = [h for h in os.environ.get("NEMOFLEET_TESTBED_HOSTS", "").split(",") if h]
_broken = os.environ.get("NEMOFLEET_TESTBED_BROKEN") == "1"
_gateway = os.environ.get("NEMOFLEET_TESTBED_GATEWAY") == "1"
_groups: dict = {}
for _name, _h in _state["hosts"].items():
    if _only and _name not in _only:
        continue
    if _name.startswith("broken") and not _broken and not _only:
        continue
    if _h["group"] == "gateway" and not _gateway and not _only:
        continue
    if _h.get("serving_group") and not _only:  # a group deploys as one unit, when named
        continue
    _groups.setdefault(_h["group"] or "gpu_unknown", []).append((_name, {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": _h["port"],
        "ssh_user": "root",
        "ssh_key": _state["key"],
        "ssh_known_hosts_file": str(testbed_dir() / "known_hosts"),
        "ssh_strict_host_key_checking": "accept-new",
        # the test hosts reach each other by container name (the weights fan-out's rsync, docs/fanout.md)
        "weights_peer_address": container(_name),
        **(_h.get("data") or {}),  # per-host data of its profile (e.g. bare-1 installs the driver)
    }))

# The testbed's gateway (NEMOFLEET_TESTBED_GATEWAY=1): gw-1 in front of the GPU hosts that are up,
# one backend each named after its host (a rollout finds a host's server by that name): its front
# door with several GPUs (one instance each), its instance port with one; each GPU host listens on
# every address of its container so gw-1 reaches it over the testbed network (docs/gateway.md).
if _gateway:
    _served = {n: h["gpus"] > 1 for n, h in sorted(_state["hosts"].items())
               if h["group"] != "gateway" and not n.startswith("broken") and not h.get("serving_group")}
    for _members in _groups.values():
        for _name, _data in _members:
            if _name in _served:
                _data.update({"front_door_address": "0.0.0.0"} if _served[_name] else {"bind_address": "0.0.0.0"})
    for _name, _data in _groups.get("gateway", []):
        _data.setdefault("gateway_backends", [{"host": container(n), "port": 8800 if multi else 8000, "name": n}
                                              for n, multi in _served.items()])

gpu_a100 = _groups.get("gpu_a100", [])
gpu_h100 = _groups.get("gpu_h100", [])
gpu_h200 = _groups.get("gpu_h200", [])
gpu_b200 = _groups.get("gpu_b200", [])
gateway = _groups.get("gateway", [])  # the fleet gateway (deploys/gateway.py)

# multi-node serving groups of the hosts that are up (the optional mn-1 + mn-2: one model over two
# hosts), members in name order, the head first
serving_groups: dict = {}
for _name, _h in sorted(_state["hosts"].items()):
    if _h.get("serving_group") and any(_name == n for hs in _groups.values() for n, _ in hs):
        serving_groups.setdefault(_h["serving_group"], []).append(_name)
serving_groups = {g: m for g, m in serving_groups.items() if len(m) > 1}

# The testbed's own group data (mirror, archives, keys, frontends: nemofleet_testbed.groupdata), as the
# group named after this file, declared last so it overrides the GPU class groups' data and host data
# overrides it. Declared here, not in group_data/, which pyinfra runs for every inventory.
testbed = ([n for hs in _groups.values() for n, _ in hs], groupdata.data())

from nemofleet.inventory import checked  # noqa: E402  (an empty inventory or a --limit typo stops the run)

checked(globals())
