"""A signed flat apt repository of simulated NVIDIA packages, served to the test hosts like
NVIDIA's own (https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /).

Only the package payload is simulated: the packages are real .deb files (dpkg-deb), the
index is a real Packages/Release/InRelease set signed with a key made for this testbed
(gpg), and the hosts install them with real apt. Payloads link the simulated tools:

- the container toolkit (nvidia-container-toolkit, -base, libnvidia-container-tools,
  libnvidia-container1) at several versions, so a pin has something to choose from;
- driver branches (nvidia-driver-<branch>-server, nvidia-utils-<branch>-server): the
  simulated nvidia-smi reports a version mismatch until the host reboots, as a real one does.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

SIM = "/opt/nemofleet-sim"
VERSION_DIR = "/usr/lib/nemofleet-sim"
TOOLKIT_VERSIONS = ["1.17.8-1", "1.18.0-1", "1.18.1-1"]
DRIVERS = {"570": ["570.124.06-0ubuntu1"], "580": ["580.95.05-0ubuntu1", "580.159.04-0ubuntu1"]}
CUDA = {"570": "12.8", "580": "13.0"}  # the CUDA version each branch reports (NVIDIA CUDA release notes, docs/recipes.md)
ARCH = "amd64"
KEY_NAME = "nemofleet testbed NVIDIA repository <apt@testbed.invalid>"


def _deb(out: Path, name: str, version: str, depends: list[str], files: dict[str, str],
         links: dict[str, str], description: str) -> Path:
    with tempfile.TemporaryDirectory(prefix="nf-deb-") as tmp:
        root = Path(tmp)
        (root / "DEBIAN").mkdir()
        control = [f"Package: {name}", f"Version: {version}", f"Architecture: {ARCH}",
                   "Maintainer: nemofleet testbed <apt@testbed.invalid>", f"Description: {description}"]
        if depends:
            control.insert(3, "Depends: " + ", ".join(depends))
        (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
        for path, text in files.items():
            p = root / path.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        for path, target in links.items():
            p = root / path.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.symlink_to(target)
        deb = out / f"{name}_{version}_{ARCH}.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
                       check=True, capture_output=True)
    return deb


def _packages(out: Path) -> list[Path]:
    debs = []
    for v in TOOLKIT_VERSIONS:
        upstream = v.split("-")[0]
        debs += [
            _deb(out, "libnvidia-container1", v, [], {}, {}, "simulated NVIDIA container library"),
            _deb(out, "libnvidia-container-tools", v, [f"libnvidia-container1 (= {v})"], {}, {},
                 "simulated NVIDIA container library tools"),
            _deb(out, "nvidia-container-toolkit-base", v, ["python3"],
                 {f"{VERSION_DIR}/toolkit-version": upstream + "\n"},
                 {"/usr/bin/nvidia-ctk": f"{SIM}/nvidia-ctk"}, "simulated NVIDIA Container Toolkit base"),
            _deb(out, "nvidia-container-toolkit", v,
                 [f"nvidia-container-toolkit-base (= {v})", f"libnvidia-container-tools (= {v})"], {},
                 {"/usr/bin/nvidia-container-runtime-hook": f"{SIM}/nvidia-container-runtime-hook",
                  "/usr/bin/nvidia-container-runtime": f"{SIM}/nvidia-container-runtime"},
                 "simulated NVIDIA Container Toolkit"),
        ]
    for branch, versions in DRIVERS.items():
        for v in versions:
            upstream = v.split("-")[0]
            debs += [
                _deb(out, f"nvidia-utils-{branch}-server", v, [], {},
                     {"/usr/bin/nvidia-smi": f"{SIM}/nvidia-smi"}, "simulated NVIDIA driver utilities"),
                _deb(out, f"nvidia-driver-{branch}-server", v, [f"nvidia-utils-{branch}-server (= {v})"],
                     {f"{VERSION_DIR}/driver-version": f"{upstream} {CUDA[branch]}\n"}, {},
                     "simulated NVIDIA data-center driver (loaded at the next boot)"),
            ]
    return debs


def _gpg(home: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--yes", "--quiet", *args],
                          check=True, capture_output=True, **kw)


def _hash_inputs() -> str:
    h = hashlib.sha256(repr((TOOLKIT_VERSIONS, DRIVERS, ARCH)).encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:12]


def build(root: Path) -> dict:
    """Build (once per recipe) the repo under root/repo and the signing key; return paths."""
    repo = root / "repo" / "stable" / "deb" / ARCH
    key = root / "nvidia-repo.gpg"
    stamp = root / "built"
    if stamp.exists() and stamp.read_text() == _hash_inputs() and key.exists():
        return {"repo_dir": str(root / "repo"), "key_file": str(key)}
    home = root / "gnupg"
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not key.exists():
        _gpg(home, "--passphrase", "", "--quick-gen-key", KEY_NAME, "ed25519", "sign", "never")
        key.write_bytes(_gpg(home, "--export", KEY_NAME).stdout)
    for old in repo.glob("*") if repo.exists() else []:
        old.unlink()
    repo.mkdir(parents=True, exist_ok=True)
    debs = _packages(repo)
    index = subprocess.run(["dpkg-scanpackages", "--multiversion", "."], cwd=repo, check=True,
                           capture_output=True, text=True).stdout
    (repo / "Packages").write_text(index)
    (repo / "Packages.gz").write_bytes(gzip.compress(index.encode(), mtime=0))
    lines = ["Origin: nemofleet testbed", "Label: NVIDIA (simulated)", "Suite: stable", f"Architectures: {ARCH}",
             "Date: " + time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime()), "SHA256:"]
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    (repo / "Release").write_text("\n".join(lines) + "\n")
    _gpg(home, "--local-user", KEY_NAME, "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release"))
    _gpg(home, "--local-user", KEY_NAME, "--armor", "--detach-sign", "-o", str(repo / "Release.gpg"),
         str(repo / "Release"))
    # the driver branches are also published under their own URL, as NVIDIA's CUDA repository
    # is apart from the toolkit's (apt refuses one URL with two keyrings)
    cuda = root / "repo" / "cuda"
    if not cuda.is_symlink():
        cuda.symlink_to("stable")
    os.chmod(key, 0o644)
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True)
    stamp.write_text(_hash_inputs())
    return {"repo_dir": str(root / "repo"), "key_file": str(key), "packages": len(debs)}
