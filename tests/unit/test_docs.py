"""Facts about the documentation: its relative links lead somewhere, the README stays a short
entry point, and every metric the exporter serves is documented."""

from __future__ import annotations

import re
from pathlib import Path

from distscrape_celery.cli.exporter import CrawlCollector
from distscrape_celery.tracker import InMemoryTracker
from tests.support import REPO_ROOT as ROOT

README_MAX_LINES = 220
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(path: Path) -> str:
    """The file's text without its fenced code blocks (a link in a code sample is not a link)."""
    out, in_code = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
        elif not in_code:
            out.append(line)
    return "\n".join(out)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces
    turned into hyphens."""
    slugs = set()
    for line in prose(path).splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            title = m.group(1).strip().lower().replace("`", "")
            slugs.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return slugs


def test_every_relative_link_leads_to_a_file_and_heading_that_exist():
    broken = []
    for doc in doc_files():
        for target in LINK.findall(prose(doc)):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_links_are_found():
    """The link test above sees the README's links into docs/ (a regex that found nothing would
    pass it)."""
    targets = LINK.findall(prose(ROOT / "README.md"))
    assert "docs/architecture.md" in targets and "docs/security.md" in targets


def test_readme_is_a_short_entry_point():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_every_metric_the_exporter_serves_is_documented():
    """The names come from the exporter itself (an empty tracker still yields every family);
    a counter is served with the `_total` suffix."""
    served = {f.name + "_total" if f.type == "counter" else f.name
              for f in CrawlCollector(InMemoryTracker()).collect()}
    assert len(served) >= 10, served
    docs = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    missing = {name for name in served if not re.search(rf"(?<!\w){name}(?!\w)", docs)}
    assert not missing, f"metrics served but not documented in docs/: {sorted(missing)}"
