"""Data for the local testbed (group named after inventories/testbed.py, so it comes last).

The testbed's Hugging Face mirror serves a tiny generated checkpoint under the Lightning
NVFP4 repo id at a pinned commit; the stand-in vLLM image comes from a local archive.
"""
import os

from nemofleet.testbed import read_state, testbed_dir

_s = read_state()
model = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": _s.get("model_revision", "main")}
hf_endpoint = _s.get("mirror_url")
vllm_image = os.environ.get("NEMOFLEET_TESTBED_IMAGE", "vllm/vllm-openai:v0.27.1")
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

