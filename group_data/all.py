"""Fleet-wide defaults. Group data per GPU class and per host override these (reference §1.5)."""
import os

# What to serve: a catalog key (see `nemofleet models`) or a mapping with overrides.
# Pin revision to a 40-hex commit SHA in production: a branch name makes every run ask the Hub.
model = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": "main"}
vllm_image = "vllm/vllm-openai:v0.27.1"
models_root = "/srv/nemofleet/models"

# Ports are published on this address only; vLLM leaves /health, /metrics, /invocations open.
bind_address = "127.0.0.1"
port_base = 8000

# API key for /v1 (uploaded as a 0600 env file). Prefer a file on the controller.
vllm_api_key_file = os.environ.get("NEMOFLEET_API_KEY_FILE", "~/.config/nemofleet/api-key")
hf_token_file = os.environ.get("NEMOFLEET_HF_TOKEN_FILE", "~/.config/nemofleet/hf-token")

# Hugging Face mirror (HF_ENDPOINT); None uses huggingface.co
hf_endpoint = os.environ.get("HF_ENDPOINT") or None

# Docker daemon.json keys nemofleet owns (others are kept)
docker_registry_mirrors = None  # e.g. ["https://mirror.example.internal"]
docker_log_driver = "json-file"
docker_log_opts = {"max-size": "100m", "max-file": "3"}

# Frontends whose Docker networks the vLLM containers join, e.g.
# frontends = [{"name": "open-webui", "network": "open-webui_default", "alias": "nemotron"},
#              {"name": "dify", "network": "dify_default", "alias": "nemotron"}]
frontends = []

# GPU selection: auto (CDI when Docker >= 25 has a CDI spec, else --gpus), cdi, gpus
gpu_selection = "auto"
nvml_remedy = "cdi"

# Health checks (cron every minute; metrics for node_exporter's textfile collector)
health_schedule = "* * * * *"
health_check_infer = False
health_fail_restart = 0  # restart an instance after N consecutive failures (0 = off)
health_webhook_url = None

# Opt-in installs (default: check only). The container toolkit from NVIDIA's apt repository,
# pinned and held; the key is a file on the controller
# (curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey > files/nvidia-container-toolkit.asc).
install_container_toolkit = False
container_toolkit_version = None  # e.g. "1.18.0-1" (required when installing)
container_toolkit_repo = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
container_toolkit_key_file = None
# The NVIDIA driver: a pinned branch, held; the host reboots only when the install changed
# something (never the machine nemofleet runs on), then preflight runs again.
install_nvidia_driver = False
nvidia_driver_branch = None  # e.g. "580"
nvidia_driver_packages = None  # default: nvidia-driver-{branch}-server, nvidia-utils-{branch}-server (Ubuntu)
nvidia_driver_repo = None  # None: the host's own apt sources; or a flat repo such as NVIDIA's CUDA repo
nvidia_driver_key_file = None
