"""Hosts from nothing: opt-in installs of the NVIDIA driver and the NVIDIA Container Toolkit
from apt repositories, pinned and held, before preflight (NVIDIA's install guide; docs/recipes.md).

Check-only is the default. The driver install reboots the host only when it changed something
or the loaded driver is not the pinned branch; the caller then runs preflight again on facts
read after the reboot.
"""

from __future__ import annotations

import os
import re

from pyinfra import host

from .operations import packages, preflight, reboot
from .settings import Settings

TOOLKIT_PACKAGES = ["nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                    "libnvidia-container1"]
TOOLKIT_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
TOOLKIT_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
# old lists that make apt fail with "Conflicting values set for option Signed-By" (NVIDIA's guide)
TOOLKIT_OLD_LISTS = [f"/etc/apt/sources.list.d/{n}.list" for n in ("nvidia-docker", "libnvidia-container",
                                                                    "nvidia-container-runtime")]
DRIVER_KEYRING = "/usr/share/keyrings/nemofleet-nvidia-driver.gpg"
DRIVER_LIST = "/etc/apt/sources.list.d/nemofleet-nvidia-driver.list"


class BootstrapState(packages.AptPackages):
    """AptPackages plus the driver that is loaded ("loaded <version>"): the kernel module's own
    version (right even when nvidia-smi fails with a driver/library mismatch after an upgrade),
    else what nvidia-smi reports."""

    def command(self, names: tuple[str, ...]) -> str:
        return (super().command(names) + "; v=$(cat /sys/module/nvidia/version 2>/dev/null || "
                "nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1); "
                "echo \"loaded ${v:-none}\"")

    def parse(self, output):
        out = super().parse([line for line in output if not line.startswith("loaded ")])
        loaded = [line.split() for line in output if line.startswith("loaded ")]
        out["_driver"] = loaded[0][1] if loaded and len(loaded[0]) > 1 and loaded[0][1] != "none" else None
        return out


def _source(s: Settings, prefix: str, repo: str | None, keyring: str, list_path: str) -> tuple[dict | None, str | None]:
    """The apt source of a repository: (source, refusal)."""
    if not repo:
        return None, None
    key_file = getattr(s, f"{prefix}_key_file")  # container_toolkit_key_file or nvidia_driver_key_file
    if not key_file:
        return None, (f"{prefix}_key_file is not set: give the repository's signing key (a file on the "
                      "controller, e.g. from https://nvidia.github.io/libnvidia-container/gpgkey)")
    try:
        key = packages.dearmor(open(os.path.expanduser(key_file), "rb").read())
    except OSError as exc:
        return None, f"{prefix}_key_file {key_file} cannot be read on the controller ({exc.strerror})"
    except ValueError as exc:  # packages.dearmor: no key apt can read
        return None, f"{prefix}_key_file {key_file} is not an OpenPGP key apt can read: {exc}"
    if not re.match(r"^https?://\S+$", repo):
        return None, f"{prefix}_repo {repo!r} must be an http(s):// URL"
    return {"list": list_path, "keyring": keyring, "key": key,
            "line": f"deb [signed-by={keyring}] {repo} /"}, None


def install(s: Settings) -> bool | None:
    """Opt-in installs before preflight: the NVIDIA driver (pinned branch, held, reboot only
    when it changed) and the container toolkit (pinned version, held). Returns True when the
    rest of the deploy must wait for them (then it runs at execution time, on fresh facts),
    None when the settings were refused (the host is failed)."""
    want_driver, want_toolkit = s.install_nvidia_driver, s.install_container_toolkit
    if not (want_driver or want_toolkit):
        return False
    refusals: list[str] = []
    branch = str(s.nvidia_driver_branch or "")
    drv_pkgs = [n.format(branch=branch) for n in
                s.nvidia_driver_packages or [f"nvidia-driver-{branch}-server", f"nvidia-utils-{branch}-server"]]
    if want_driver and not re.match(r"^\d{3}$", branch):
        refusals.append(f"nvidia_driver_branch must be a driver branch such as '580' (got {s.nvidia_driver_branch!r})")
    drv_source = tk_source = None
    if want_driver:
        drv_source, why = _source(s, "nvidia_driver", s.nvidia_driver_repo, DRIVER_KEYRING, DRIVER_LIST)
        refusals += [why] if why else []
    tk_version = s.container_toolkit_version
    tk_debs = None
    if want_toolkit and s.bundle:  # from the signed bundle's .deb files: no repository, no key
        from . import bundle  # noqa: PLC0415 (below bootstrap: it reads and verifies only)

        b, why = bundle.for_host(s)
        refusals += [r for r in (packages.check_pin("container_toolkit_version", tk_version), why) if r]
        tk_debs = [(n, *bundle.upload(b, n)) for n in bundle.debs(b, TOOLKIT_PACKAGES, tk_version)] if b else []
        if b and len(tk_debs) < len(TOOLKIT_PACKAGES):
            refusals.append(f"the bundle {s.bundle} lacks the NVIDIA Container Toolkit {tk_version} packages this host "
                            "installs: make a new bundle from this inventory (nemofleet bundle create)")
    elif want_toolkit:
        tk_source, why = _source(s, "container_toolkit", s.container_toolkit_repo,
                                 TOOLKIT_KEYRING, TOOLKIT_LIST)
        refusals += [r for r in (packages.check_pin("container_toolkit_version", tk_version), why) if r]
    if drv_source and tk_source and drv_source["line"].split("] ")[1] == tk_source["line"].split("] ")[1]:
        refusals.append("nvidia_driver_repo and container_toolkit_repo are the same URL, and apt refuses one "
                        "source with two keyrings; serve the driver repository under its own URL")
    if refusals:
        preflight.verdict(name="Preflight: can nemofleet install the NVIDIA packages?", refusals=refusals)
        return None
    names = (drv_pkgs if want_driver else []) + (TOOLKIT_PACKAGES if want_toolkit else [])
    have = host.get_fact(BootstrapState, names=tuple(names))
    pending = bool((want_driver and packages.unmet(have, drv_pkgs, f"{branch}.*"))
                   or (want_toolkit and packages.unmet(have, TOOLKIT_PACKAGES, tk_version or "")))
    loaded_ok = bool(have["_driver"]) and have["_driver"].startswith(f"{branch}.")
    if want_driver:
        packages.pinned(name=f"NVIDIA driver {branch} (pinned, held)", packages=drv_pkgs, version=f"{branch}.*",
                        pin_file="/etc/apt/preferences.d/nemofleet-nvidia-driver", label=f"NVIDIA driver {branch}",
                        source=drv_source)
        # decided from the facts (an honest --dry: no conditional reboot): the driver packages this run
        # installs, or a driver branch that is not the loaded one
        if not loaded_ok or packages.off_version(have, drv_pkgs, f"{branch}.*"):
            reboot.reboot_and_wait(name=f"Reboot into NVIDIA driver {branch}",
                                   why=f"NVIDIA driver {branch} was installed and is not loaded yet")
        pending = pending or not loaded_ok
    if want_toolkit:
        packages.pinned(name=f"NVIDIA Container Toolkit {tk_version} (pinned, held)", packages=TOOLKIT_PACKAGES,
                        version=tk_version or "", pin_file="/etc/apt/preferences.d/nvidia-container-toolkit",
                        label="NVIDIA Container Toolkit", source=tk_source, conflicting=TOOLKIT_OLD_LISTS, debs=tk_debs,
                        # Docker finds the toolkit's hook (--gpus) only when it starts
                        after_install="if systemctl is-active -q docker; then systemctl restart docker; fi")
    return pending
