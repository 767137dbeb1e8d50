"""Generate a tiny, structurally real model repo (config, tokenizer, safetensors shards).

The shards are valid safetensors files, so nemofleet's completeness check and the stand-in
server see exactly what they would see for a real checkpoint, only smaller.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct


def safetensors_bytes(tensors: dict[str, tuple[list[int], bytes]]) -> bytes:
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def _data(seed: str, n: int) -> bytes:
    out, block = b"", hashlib.sha256(seed.encode()).digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block
    return out[:n]


def build(dest: str, repo_id: str, shards: int = 2, shard_bytes: int = 256 * 1024, label: str = "v1",
          extra_files: dict[str, str] | None = None) -> str:
    """Write the repo under dest/<repo_id>/<sha>/ and refs.json; return the commit sha."""
    files: dict[str, bytes] = {}
    weight_map, total = {}, 0
    for i in range(1, shards + 1):
        fname = f"model-{i:05d}-of-{shards:05d}.safetensors"
        n = shard_bytes // 2
        tname = f"backbone.layers.{i - 1}.mixer.weight"
        files[fname] = safetensors_bytes({tname: ([n // 2], _data(f"{repo_id}{label}{i}", n))})
        weight_map[tname] = fname
        total += n
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2).encode()
    files["config.json"] = json.dumps({
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
        "max_position_embeddings": 1048576, "num_key_value_heads": 2, "head_dim": 128,
        "hybrid_override_pattern": "M-M-M*-M-M-M*-M-M-M*-M-M-M*-M-M-M*-M-M-M*", "num_nextn_predict_layers": 1,
        "nemofleet_tiny": label,
    }, indent=2).encode()
    files["tokenizer.json"] = json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}}).encode()
    files["tokenizer_config.json"] = json.dumps({"chat_template": "{{ messages }}"}).encode()
    files["generation_config.json"] = json.dumps({"temperature": 1.0, "top_p": 0.95}).encode()
    for name, text in (extra_files or {}).items():
        files[name] = text.encode()
    return publish(dest, repo_id, files)


def publish(dest: str, repo_id: str, files: dict[str, bytes]) -> str:
    """Write files as a commit of repo_id under dest/<repo_id>/<sha>/, make it main; return the sha."""
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(name.encode() + hashlib.sha1(files[name]).digest())
    sha = digest.hexdigest()
    base = os.path.join(dest, repo_id, sha)
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(base, name)), exist_ok=True)
        with open(os.path.join(base, name), "wb") as f:
            f.write(data)
    refs_path = os.path.join(dest, repo_id, "refs.json")
    refs = json.load(open(refs_path)) if os.path.exists(refs_path) else {}
    refs["main"] = sha
    with open(refs_path, "w") as f:
        json.dump(refs, f)
    return sha
