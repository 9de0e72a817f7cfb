"""MkDocs hook (mkdocs.yml, ``hooks:``): headings get GitHub's anchors, so one link such as
``benchmarks.md#measuring-on-a-gpu-in-a-few-minutes-benchmarksgpu_leasepy`` works on GitHub and in the site.

Python-Markdown's own slugs differ from GitHub's where a heading holds punctuation between spaces
(``GPU + CPU``: GitHub ``gpu--cpu``, Python-Markdown ``gpu-cpu``) or letters outside ASCII. The one difference
left: a repeated heading is ``name-1`` on GitHub and ``name_1`` in the site, so links avoid repeated headings.
tests/test_docs_site.py checks README.md's links with the same rule.
"""

from __future__ import annotations

import re
import unicodedata


def github_slug(text: str, separator: str = "-") -> str:
    """GitHub's heading anchor: lower case; letters, marks, numbers, ``_``, ``-`` and spaces kept, everything
    else dropped; every space becomes ``-`` (no collapsing)."""
    kept = (char for char in text.strip().lower()
            if char in " -_" or unicodedata.category(char)[0] in "LMN")
    return "".join(kept).replace(" ", separator)


def on_config(config):
    config.mdx_configs.setdefault("toc", {})["slugify"] = github_slug
    return config


_SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj):(?=<code>)")


def on_page_content(html, page, config, files):
    """The API pages (mkdocstrings) render the docstrings' Sphinx roles (``:class:`Bands```) as text: keep the code."""
    if page.file.src_uri.startswith("api/"):
        html = _SPHINX_ROLE.sub("", html)
    return html
