"""Facts read by nemofleet's own operations (moved here so every fact lives in facts/)."""

from __future__ import annotations

from .. import shell  # the one quoting boundary

from . import Fact


class FilesDigest(Fact):
    """{path: (mode, sha256) or None} for every path, in one command.

    Regular files are read with one `stat` and one `sha256sum` for all of them (not three
    programs per file: a converged host's no-op reads a dozen files), printed as sections that
    process() pairs in order; a directory reads "<mode> dir <path>", an absent path "- - <path>".
    A section whose length does not match the files (one vanished between the test and the read)
    makes those files unknown (None: written again), never paired with another file's digest."""

    FILES, MODES, SUMS = "@nemofleet-files", "@nemofleet-modes", "@nemofleet-sums"

    def command(self, paths: tuple[str, ...]) -> str:
        quoted = " ".join(shell.quote(p) for p in paths)
        return (f"set --; for p in {quoted}; do if [ -f \"$p\" ]; then set -- \"$@\" \"$p\"; "
                "elif [ -d \"$p\" ]; then echo \"$(stat -c %a \"$p\") dir $p\"; "
                "else echo \"- - $p\"; fi; done; "
                f"if [ $# -gt 0 ]; then echo {self.FILES}; printf '%s\\n' \"$@\"; echo {self.MODES}; "
                f"stat -c %a -- \"$@\"; echo {self.SUMS}; sha256sum -- \"$@\"; fi")

    def parse(self, output):
        out = {}
        section, files, modes, sums = None, [], [], []
        for line in output:
            if line in (self.FILES, self.MODES, self.SUMS):
                section = line
            elif section == self.FILES:
                files.append(line)
            elif section == self.MODES:
                modes.append(line.strip())
            elif section == self.SUMS:
                # sha256sum prefixes a line with a backslash when it escaped the name
                sums.append(line.lstrip("\\").split(" ", 1)[0])
            elif len(line.split(" ", 2)) == 3:  # "<mode> dir <path>" or "- - <path>"
                mode, digest, path = line.split(" ", 2)
                out[path] = None if mode == "-" else (mode, digest)
        paired = len(modes) == len(files) == len(sums)
        for i, path in enumerate(files):
            out[path] = (modes[i], sums[i]) if paired else None
        return out


class FileText(Fact):
    def command(self, path: str) -> str:
        return f"cat {shell.quote(path)} 2>/dev/null || true"

    def parse(self, output):
        return "\n".join(output) + "\n"
