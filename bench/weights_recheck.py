"""Benchmark: time to re-check a complete model, for models of very different sizes.

The completeness check reads each shard's safetensors header and compares sizes; the fast path
compares the completion marker's recorded sizes with stat(). Neither reads the tensor bytes, so
the time depends on the number of files, not on their size. Shards are sparse files here (their
apparent size is real for stat() and the header check; no disk is used).

    python bench/weights_recheck.py        # prints a table and writes bench/results/weights.json
"""
import json
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from nemofleet.facts.weights import CHECK_SCRIPT  # noqa: E402


def make_model(d: Path, shards: int, shard_bytes: int) -> None:
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        header = json.dumps({"__metadata__": {"format": "pt"},
                             f"layers.{i}.weight": {"dtype": "BF16", "shape": [shard_bytes // 2],
                                                    "data_offsets": [0, shard_bytes]}}).encode()
        header += b" " * (-len(header) % 8)
        with open(d / name, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header)
            f.truncate(8 + len(header) + shard_bytes)  # sparse
        weight_map[f"layers.{i}.weight"] = name
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": shards * shard_bytes}, "weight_map": weight_map}))
    (d / "config.json").write_text("{}")
    (d / "tokenizer.json").write_text("{}")


def timed(d: Path, mode: str, reps: int = 5) -> float:
    best = None
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", CHECK_SCRIPT, str(d), "a" * 40, mode], check=True, capture_output=True)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return round(best, 3)


def main():
    rows = []
    for label, shards, size in [("tiny (2 x 128 KiB)", 2, 128 * 1024),
                                ("Lightning NVFP4-like (52 x 415 MB = 21.6 GB)", 52, 415 * 10**6),
                                ("Super VL BF16-like (50 x 4.64 GB = 232 GB)", 50, 4_636 * 10**6)]:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            make_model(d, shards, size)
            full_check = timed(d, "check")
            subprocess.run([sys.executable, "-c", CHECK_SCRIPT, str(d), "a" * 40, "write"], check=True, capture_output=True)
            marker = timed(d, "check")
            rows.append({"model": label, "files": shards + 3, "bytes": shards * size,
                         "header_check_s": full_check, "marker_check_s": marker})
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "weights.json").write_text(json.dumps(rows, indent=2))
    print("| model | files | header check (no marker) | re-check with marker |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['files']} | {r['header_check_s']} s | {r['marker_check_s']} s |")


if __name__ == "__main__":
    main()
