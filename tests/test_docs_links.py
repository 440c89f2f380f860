"""Every relative link in the repository's Markdown resolves: the file or folder exists and, where the
link names a ``#fragment`` in a Markdown file, that file has a heading (or an HTML ``id``/``name``)
with that anchor. Links with a scheme (``https:``, ``mailto:``) are not followed.

Anchors are GitHub's: the heading's text lower-cased, punctuation other than ``-`` and ``_`` dropped,
spaces turned into ``-``, and ``-1``, ``-2`` … appended to repeats.
"""

import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

from tests.procs import REPO

SKIPPED_DIRS = {"node_modules", "build", "dist"}
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+).+?\1")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
ATX_HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s[^>]*?(?:id|name)=[\"']([^\"']+)[\"']", re.IGNORECASE)


def markdown_files() -> list[Path]:
    """The repository's own Markdown: hidden folders (.venv, .git), build output and egg-info left out."""

    def ours(path: Path) -> bool:
        parts = path.relative_to(REPO).parts[:-1]
        return not any(p.startswith(".") or p in SKIPPED_DIRS or p.endswith(".egg-info") for p in parts)

    return sorted(p for p in REPO.rglob("*.md") if ours(p))


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fence = [], ""
    for line in text.splitlines():
        opener = FENCE.match(line)
        if fence:
            if opener and opener.group(1)[0] == fence[0] and len(opener.group(1)) >= len(fence):
                fence = ""
            continue
        if opener:
            fence = opener.group(1)
            continue
        lines.append(line)
    return lines


def link_targets(text: str) -> list[str]:
    targets = []
    for line in prose_lines(text):
        line = INLINE_CODE.sub("", line)
        targets += [m.group(1) for m in INLINE_LINK.finditer(line)]
        definition = REFERENCE_DEF.match(line)
        if definition:
            targets.append(definition.group(1))
    return [t[1:-1] if t.startswith("<") else t for t in targets]


def slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    seen: Counter[str] = Counter()
    found = set(HTML_ANCHOR.findall(text))
    for line in prose_lines(text):
        heading = ATX_HEADING.match(line)
        if heading:
            base = slug(heading.group(1))
            found.add(f"{base}-{seen[base]}" if seen[base] else base)
            seen[base] += 1
    return found


def broken_link(source: Path, target: str) -> str | None:
    """Why ``target`` (as written in ``source``) does not resolve, or None when it does."""
    path_part, _, fragment = target.partition("#")
    path_part = unquote(path_part)
    if not path_part:
        resolved = source
    elif path_part.startswith("/"):
        resolved = REPO / path_part.lstrip("/")
    else:
        resolved = source.parent / path_part
    if not resolved.exists():
        return "no such file"
    if fragment and resolved.is_file() and resolved.suffix == ".md" and unquote(fragment) not in anchors(resolved):
        return f"no heading with anchor #{fragment}"
    return None


def test_the_link_checker_sees_links_headings_and_code() -> None:
    text = "# Run `kvgate up`: fast!\n## Run kvgate up fast\n[a](x.md#y) ![b](<i m.png>)\n`[c](no.md)`\n```\n[d](no.md)\n```\n[e]: ref.md\n"
    assert link_targets(text) == ["x.md#y", "i m.png", "ref.md"]
    assert slug("Run `kvgate up`: fast!") == "run-kvgate-up-fast"
    assert slug("The [engine](docs/engine.md) (CPU)") == "the-engine-cpu"


def test_every_relative_markdown_link_resolves() -> None:
    files = markdown_files()
    assert REPO / "README.md" in files
    broken = []
    for source in files:
        for target in link_targets(source.read_text(encoding="utf-8")):
            if SCHEME.match(target):
                continue
            reason = broken_link(source, target)
            if reason:
                broken.append(f"{source.relative_to(REPO)}: ({target}) {reason}")
    assert not broken, "broken links:\n" + "\n".join(broken)
