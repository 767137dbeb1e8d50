"""Fleet-wide choices. Every key and its default is declared once in src/nemofleet/settings.py
(`nemofleet settings` lists them; docs/settings.md's table is generated from it); set here only
what this fleet wants different. Group data per GPU class and per host override these, and a
misspelt key is refused by preflight ("did you mean ...?").
"""
import os

# What to serve: a catalog key (see `nemofleet models`) or a mapping with overrides.
# Pin revision to a 40-hex commit SHA in production: a branch name makes every run ask the Hub.
model = {"catalog": "nemotron-3.5-lightning-nvfp4", "revision": "main"}

# API key for /v1 and an optional HF token: files on the controller, uploaded as 0600 files.
if os.environ.get("NEMOFLEET_API_KEY_FILE"):
    vllm_api_key_file = os.environ["NEMOFLEET_API_KEY_FILE"]
if os.environ.get("NEMOFLEET_HF_TOKEN_FILE"):
    hf_token_file = os.environ["NEMOFLEET_HF_TOKEN_FILE"]

# Hugging Face mirror (HF_ENDPOINT); unset: huggingface.co
if os.environ.get("HF_ENDPOINT"):
    hf_endpoint = os.environ["HF_ENDPOINT"]

# Frontends whose Docker networks the vLLM containers join, e.g.
# frontends = [{"name": "open-webui", "network": "open-webui_default", "alias": "nemotron"},
#              {"name": "dify", "network": "dify_default", "alias": "nemotron"}]

# Opt-in installs of the NVIDIA Container Toolkit / driver (docs/operator-guide.md, "Hosts from nothing"), e.g.
# install_container_toolkit = True
# container_toolkit_version = "1.18.0-1"
# container_toolkit_key_file = "files/nvidia-container-toolkit.asc"
