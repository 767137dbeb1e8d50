"""Facts read by nemofleet's own operations (moved here so every fact lives in facts/)."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class FilesDigest(FactBase):
    """{path: (mode, sha256) or None} for every path, in one command."""

    def command(self, paths: tuple[str, ...]) -> str:
        quoted = " ".join(shlex.quote(p) for p in paths)
        return (f"for p in {quoted}; do if [ -f \"$p\" ]; then "
                "echo \"$(stat -c %a \"$p\") $(sha256sum < \"$p\" | cut -d' ' -f1) $p\"; "
                "elif [ -d \"$p\" ]; then echo \"$(stat -c %a \"$p\") dir $p\"; "
                "else echo \"- - $p\"; fi; done")

    def process(self, output):
        out = {}
        for line in output:
            mode, digest, path = line.split(" ", 2)
            out[path] = None if mode == "-" else (mode, digest)
        return out


class FileText(FactBase):
    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        return "\n".join(output) + "\n"
