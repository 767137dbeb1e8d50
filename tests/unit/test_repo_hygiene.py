"""No testbed state (SSH keys, API keys, tokens) is ever committed; the documentation's links resolve,
and the README stays a front page."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (ROOT / ".git").exists() or not shutil.which("git"), reason="not a git checkout")
def test_no_testbed_state_or_private_keys_tracked():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert not [f for f in files if f.startswith(".testbed")]
    for f in files:
        p = ROOT / f
        if p.is_file() and p.stat().st_size < 100_000:
            assert b"PRIVATE" + b" KEY-----" not in p.read_bytes(), f


# ---------------------------------------------------------------------------- the documentation

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text of a Markdown page without fenced code blocks and code spans (a link there is code)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: Markdown marks dropped, lower case, punctuation other than
    `-` and `_` removed, spaces as `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a link may name on the page: each heading's GitHub slug (repeats numbered -1,
    -2, ... as GitHub does) and an explicit `{#id}` at a heading's end (docs/recipes.md's)."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        explicit = re.search(r"\{#([\w\-]+)\}$", heading)
        if explicit:
            out.add(explicit.group(1))
            heading = heading[:explicit.start()].strip()
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_the_documentation_links_resolve():
    """Every relative link of README.md and docs/*.md names a file that exists (in this checkout)
    and, with #anchor, a heading of that page."""
    assert (ROOT / "docs").is_dir()
    broken = []
    for page in DOCS:
        for target in _LINK.findall(_prose(page.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:: not a file here
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no file {path}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_the_link_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n## Real hosts {#real}\n\n## Real hosts\n\n"
                    "`[not a link](nowhere.md)`\n\n```\n[nor this](nowhere.md)\n```\n")
    assert anchors(page) == {"a-page", "real", "real-hosts", "real-hosts-1"}
    assert _LINK.findall(_prose(page.read_text())) == []
    assert _LINK.findall("see [the guide](docs/operator-guide.md#hosts-from-nothing) and [x](<a b.md>)") == [
        "docs/operator-guide.md#hosts-from-nothing"]
    assert _slug('The NVML "Unknown Error" trap') == "the-nvml-unknown-error-trap"
    assert _slug("Disaster recovery: `nemofleet rebuild`") == "disaster-recovery-nemofleet-rebuild"


def test_the_readme_is_a_front_page():
    """The README a newcomer reads: at most about 250 lines, the two set-up commands of a fresh
    machine in its first 40; the rest lives in docs/ (README's Documentation table)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move a topic to docs/"
    head = "\n".join(lines[:40])
    assert "make demo" in head and "make test" in head
    linked = set(re.findall(r"\(docs/([\w\-]+\.md)", "\n".join(lines)))
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= linked, "a docs/ page the README does not link"
