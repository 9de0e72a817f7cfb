"""The documentation's links: docs/ builds as a site with ``mkdocs build --strict`` (mkdocs.yml: a link to a missing
page or heading, or a page left out of nav, fails it), and every relative link of README.md, which lies outside
docs_dir, leads to a file that exists and, with ``#anchor``, to a heading of that file by GitHub's rule (the rule
docs/hooks.py gives the site, so README's links into docs/ work on GitHub and in the site alike)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load_hooks():
    spec = importlib.util.spec_from_file_location("rsnet_docs_hooks", REPO / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


github_slug = _load_hooks().github_slug

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)(\s+#+)?\s*$")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(\s|$)")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked out (neither holds headings or links)."""
    lines, fence = [], None
    for line in text.splitlines():
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
        else:
            lines.append(line)
    return lines


def anchors(text: str) -> set[str]:
    """Every ``#anchor`` a Markdown file offers on GitHub: its headings' slugs (a repeated one gets -1, -2, ...)
    and the ids of explicit ``<a id=...>`` / ``<a name=...>`` tags."""
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for line in _prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", match.group(2))  # a link or image: its text
        slug = github_slug(title.replace("`", "").replace("**", ""))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(text: str) -> list[str]:
    """The link targets of a Markdown text that are neither absolute URLs nor e-mail addresses."""
    targets = []
    for line in _prose_lines(text):
        line = re.sub(r"`[^`]*`", "``", line)
        targets += INLINE_LINK.findall(line)
        reference = REFERENCE_LINK.match(line)
        if reference:
            targets.append(reference.group(1))
    return [target for target in targets if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)]


def broken_links(markdown: Path, root: Path = REPO) -> list[str]:
    """Each relative link of ``markdown`` whose file is missing, or whose ``#anchor`` is no heading of its target
    (``root``: the folder the messages name files from)."""
    text = markdown.read_text(encoding="utf-8")
    broken = []
    for target in relative_links(text):
        path, _, anchor = target.partition("#")
        file = (markdown.parent / path).resolve() if path else markdown
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor:
            if file.suffix != ".md":
                broken.append(f"{target}: an anchor into a file that is not Markdown")
            elif anchor not in anchors(file.read_text(encoding="utf-8")):
                broken.append(f"{target}: no heading #{anchor} in {file.relative_to(root)}")
    return broken


def test_github_slugs() -> None:
    assert github_slug("Training (`scripts/train.py`)".replace("`", "")) == "training-scriptstrainpy"
    assert github_slug("Second GPU run: the GPU + CPU pair (one H200; 2026-11-26)") == \
        "second-gpu-run-the-gpu--cpu-pair-one-h200-2026-11-26"
    assert github_slug("Σs/s_max — 1 × 2") == "σss_max--1--2"
    text = "# A\n```bash\n# not a heading\n```\n## B `c`\n## B `c`\n<a id=\"x\"></a>\n"
    assert anchors(text) == {"a", "b-c", "b-c-1", "x"}


def test_the_link_check_finds_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## A section\n")
    readme = tmp_path / "README.md"
    readme.write_text("# Top\n[ok](docs/page.md#a-section) [top](#top) [web](https://example.org/x#y)\n"
                      "`[not a link](nowhere.md)`\n```\n[nor this](nowhere.md)\n```\n"
                      "[gone](docs/gone.md) [no such heading](docs/page.md#b-section) [here](#nothing)\n")
    assert [entry.split(":")[0] for entry in broken_links(readme, root=tmp_path)] == [
        "docs/gone.md", "docs/page.md#b-section", "#nothing"]


def test_readme_links_resolve() -> None:
    readme = REPO / "README.md"
    assert relative_links(readme.read_text(encoding="utf-8")), "README.md links no page"
    assert broken_links(readme) == []


def named_files_missing(readme: Path) -> list[str]:
    """Files and folders that ``readme`` says the clone holds and it lacks: a Markdown file named anywhere, and the
    paths in backticks above its section on the full datasets (placeholders such as ``<class>`` cut off)."""
    text = readme.read_text(encoding="utf-8")
    held = text.split("## The full datasets")[0]
    names = set(re.findall(r"[\w./-]+\.md\b", text))
    names |= {path.split("<")[0].split("...")[0] for path in re.findall(r"`([^`\s]*/[^`\s]*)`", held)}
    return sorted(name for name in names
                  if not any((root / name).exists() for root in (readme.parent, REPO)))


def test_data_readme_names_only_what_the_clone_holds() -> None:
    """Was: data/README.md named a ucmerced-tif-sample/ beside it and a DESIGN.md, neither in the clone."""
    assert named_files_missing(REPO / "data" / "README.md") == []


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=config.parent, capture_output=True, text=True, timeout=300)


def test_docs_build_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    result = _build(REPO / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    built = {path.parent.name for path in (tmp_path / "site").glob("*/index.html")}
    pages = {path.stem for path in (REPO / "docs").glob("*.md")} - {"index"}
    assert pages <= built, sorted(pages - built)


@pytest.mark.parametrize("breakage", ["[gone](no_such_page.md)", "[gone](models.md#no-such-heading)",
                                      "[gone](#no-such-heading)"])
def test_docs_build_fails_on_a_broken_link(tmp_path: Path, breakage: str) -> None:
    """The settings of mkdocs.yml stay strict: a copy of the docs with one broken link does not build."""
    pytest.importorskip("mkdocs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    page = tmp_path / "docs" / "extending.md"
    page.write_text(page.read_text(encoding="utf-8") + f"\n{breakage}\n", encoding="utf-8")
    result = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert breakage[len("[gone]("):-1].lstrip("#") in result.stdout + result.stderr


def test_docs_build_fails_on_a_page_left_out_of_nav(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in nav\n", encoding="utf-8")
    result = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "orphan.md" in result.stdout + result.stderr
