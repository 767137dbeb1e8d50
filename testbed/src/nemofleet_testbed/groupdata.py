"""The group data of the local testbed: inventories/testbed.py declares it as its own group
`testbed` (named after the file and listed last, so it overrides the GPU class groups' data as
group_data/testbed.py did, and host data overrides it). It lives here, in the testbed package,
not in group_data/: pyinfra executes every file of group_data/ for any inventory, so a testbed
file there made the production inventory import the testbed (issue 46).

The testbed's Hugging Face mirror serves a tiny generated checkpoint under the Lightning
NVFP4 repo id at a pinned commit; the stand-in vLLM image comes from a local archive.
"""
from __future__ import annotations

import os

from . import read_state, testbed_dir


def data() -> dict:
    """The testbed group's data, read from the testbed's state now."""
    _s = read_state()
    model = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": _s.get("model_revision", "main")}
    hf_endpoint = _s.get("mirror_url")
    if os.environ.get("NEMOFLEET_TESTBED_IMAGE"):
        vllm_image = os.environ["NEMOFLEET_TESTBED_IMAGE"]
    vllm_image_archives = _s.get("archives") or {}  # docker save archives, per image reference
    vllm_api_key_file = str(testbed_dir() / "api-key")
    hf_token_file = str(testbed_dir() / "hf-token")
    # a fleet key so a rebuilt host can copy weights from a peer (`--data weights_seed_from=<peer>`)
    weights_seed_key_file = str(testbed_dir() / "seed_ed25519")
    weights_seed_public_key_file = str(testbed_dir() / "seed_ed25519.pub")
    frontends = [
        {"name": "open-webui", "network": "open-webui_default", "alias": "nemotron", "create": True},
        {"name": "dify", "network": "dify_default", "alias": "nemotron", "create": True},
    ]
    health_check_infer = True
    ready_timeout = 120
    # the simulated NVIDIA apt repository (driver branches, container toolkit), signed with a testbed key;
    # used by hosts that set install_nvidia_driver / install_container_toolkit (bare-1)
    container_toolkit_repo = _s.get("apt_repo_url")
    container_toolkit_key_file = _s.get("apt_key_file")
    container_toolkit_version = "1.18.0-1"
    nvidia_driver_repo = _s.get("apt_driver_repo_url")
    nvidia_driver_key_file = _s.get("apt_key_file")
    # `nemofleet bundle create` on this controller: the mirrors as published on 127.0.0.1, the
    # testbed's signing key and the allowed signers file that trusts it (docs/air-gap.md)
    bundle_hf_endpoint = _s.get("mirror_local_url")
    bundle_apt_repo = _s["apt_local_url"] + "/stable/deb/$(ARCH)" if _s.get("apt_local_url") else None
    bundle_signing_key_file = str(testbed_dir() / "bundle_ed25519")
    bundle_allowed_signers_file = str(testbed_dir() / "allowed_signers")

    # `make test-real-vllm`: the real vLLM server (CPU build) and a tiny Llama through the same
    # mirror -> weights -> unit path (tests/real_vllm/test_server.py records them in the state)
    _real = _s.get("real_vllm")
    if _real:
        model = _real["model"]
        vllm_image = _real["image"]
        vllm_image_archives = {**vllm_image_archives, _real["image"]: _real["archive"]}
        max_model_len = 512
        gpu_memory_utilization = 0.25  # on the CPU build: a fraction of host RAM
        max_num_seqs = 4
        max_num_batched_tokens = 2048
        ready_timeout = 900  # the CPU build needs about 100 s to start here
        # the CPU build compiles the model with torch inductor, which needs a C++ compiler that this
        # image does not carry (and minutes on 2 cores): run it eagerly, as vLLM's own CPU CI does
        vllm_extra_args = {"--enforce-eager": True}
    return {k: v for k, v in locals().items() if not k.startswith('_')}
