"""Model weights on disk: completeness check (offline, O(files)) and the catalog overrides.

The check is the program remote/weights_check.py (stdlib python3 on the host); the weights
operation also runs it in `write` mode, to write the completion marker last, and in `clean` mode,
to unlink what it found truncated.
"""

from __future__ import annotations

import re

from . import Fact

from .. import paths, remote, shell
from ..factmodel import weights_state
from ..valuetypes import host_json, host_number, reads_host, shown

MARKER = ".nemofleet-complete"
# the check's text, for the benches that run it with their own python (bench/weights_recheck.py)
CHECK_SCRIPT = remote.source("weights_check")


# Bounded like every remote command: the check stats the files (a hung NFS models root must not
# hang the run); `full` hashes every shard (232 GB at a slow disk's 100 MB/s is ~40 min).
CHECK_TIMEOUT = {"check": 600, "write": 600, "full": 4 * 3600, "clean": 600}


def check_command(directory: str, revision: str, mode: str) -> str:
    """The weights check of `directory` for `revision` (mode: check, write, full or clean)."""
    return shell.join(["timeout", CHECK_TIMEOUT[mode], *remote.argv("weights_check", directory, revision, mode)])


class WeightsStatus(Fact):
    """Completeness of one model directory for one revision (remote/weights_check.py)."""

    def command(self, directory: str, revision: str, full: bool = False) -> str:
        return check_command(directory, revision, "full" if full else "check") + " 2>/dev/null || true"

    def parse(self, output):
        # typed here: an answer that is not the check's (not JSON, a field of another type, a
        # file name outside the directory) is no answer, and the operation fetches and verifies
        for line in reversed(output):
            if line.startswith("{"):
                try:
                    return weights_state(host_json(line))
                except ValueError:
                    return None
        return None


class ModelsOnDisk(Fact, part="models", reads={"root": "models_root"}):
    """Per model directory under `root`: the index total_size and the config fields the plan uses
    (remote/models_on_disk.py)."""

    def command(self, root: str) -> str:
        # bounded: a hung NFS models root must not hang the run (no answer: no models known).
        # -I -S: the stdlib only (json, os, sys), without the site module and its .pth scan, which
        # is a third of a python start's CPU on every converged host's no-op
        return shell.join(["timeout", 60, *remote.argv("models_on_disk", root)]) + " 2>/dev/null || echo '{}'"

    def parse(self, output):
        try:
            return host_json("\n".join(output))
        except ValueError:
            return {}


def status_from_models(root: str, name: str, meta: dict) -> tuple[dict, dict] | None:
    """(WeightsStatus kwargs, value) that the weights check (check mode) would answer for a
    directory whose marker ModelsOnDisk found intact: the deploy's read of it is then answered
    from HostFacts, with no second python start on the host (facts/prefetch.py)."""
    ok = meta.get("marker_ok") if isinstance(meta, dict) else None
    if not isinstance(ok, dict) or not meta.get("revision"):
        return None
    d = f"{root}/{name}"
    return ({"directory": d, "revision": meta["revision"], "full": False},
            {"dir": d, "exists": True, "complete": True, "marker": True, "missing": [], "truncated": [],
             "incomplete_files": ok.get("incomplete_files", 0), "present_bytes": ok.get("present_bytes", 0),
             "total_size": ok.get("total_size")})


HUB_COMMIT_TIMEOUT = 20


class HubCommit(Fact):
    """The 40-hex commit a branch or tag names on the Hub (or its mirror), asked from the host
    (the host, not the controller, reaches the mirror): {"sha"} or {"error": sentence}.
    Only read when a revision is not pinned to a commit; bounded to HUB_COMMIT_TIMEOUT s, the
    program's own deadline a few seconds below it (it then answers its own sentence). The program
    is remote/hub.py (`commit`): the token never follows a redirect to another host."""

    def command(self, endpoint: str, repo: str, revision: str) -> str:
        # the token is read on the host from its 0600 file (its path is an argument)
        return (shell.join(["timeout", HUB_COMMIT_TIMEOUT, *remote.argv("hub", "commit", endpoint, repo, revision,
                                                                        paths.HF_ENV, HUB_COMMIT_TIMEOUT - 5)])
                + f" 2>/dev/null || echo '{{\"error\": \"the Hub query did not finish within {HUB_COMMIT_TIMEOUT} s\"}}'")

    empty: dict = {"error": "no answer from the Hub query"}  # no output at all (pyinfra's value for it too)

    def parse(self, output):
        for line in reversed(output):
            try:
                out = host_json(line)
            except ValueError:
                continue
            out = out if isinstance(out, dict) else {}
            sha, why = out.get("sha"), out.get("error")
            if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{40}", sha):
                return {"sha": sha}
            if isinstance(why, str) and why and why.isprintable():
                return {"error": why[:300]}
            return {"error": f"unexpected answer {shown(line, 80)}"}
        return self.default()


HUB_COMMIT_MARK = "hub_commit "


def hub_commits_script(items) -> str:
    """HubCommit's command for each (endpoint, repo, revision), each answer after a marker line:
    what `nemofleet status` and `nemofleet plan` run on a host (in their one remote command) to
    pin a revision exactly as the deploy's HubCommit fact does."""
    return "".join(f"echo {HUB_COMMIT_MARK}{k}\n{HubCommit().command(*item)}\n" for k, item in enumerate(items))


@reads_host(lambda why, items, lines: {tuple(item): {"error": why} for item in items})
def parse_hub_commits(items, lines) -> dict:
    """{(endpoint, repo, revision): {"sha"} | {"error"}} from the output of hub_commits_script(items)."""
    answers: dict = {}
    current = None
    for line in lines:
        k = host_number(line[len(HUB_COMMIT_MARK):], 0, len(items) - 1) if line.startswith(HUB_COMMIT_MARK) else None
        if k is not None:
            current = k
            answers[current] = []
        elif current is not None:
            answers[current].append(line)
    return {tuple(item): HubCommit().process(answers.get(k, [])) for k, item in enumerate(items)}
