"""docs/errors.md names a test for every case it lists; every one of those tests exists."""

from __future__ import annotations

import re

from helpers import REPO


def test_every_test_named_in_the_error_table_exists() -> None:
    table = (REPO / "docs" / "errors.md").read_text()
    named = set(re.findall(r"\b(test_\w+)\b", table)) - {
        name for name in re.findall(r"\b(test_\w+)\.py\b", table)}  # file names, checked below
    defined = {match for path in (REPO / "tests").glob("test_*.py")
               for match in re.findall(r"^def (test_\w+)", path.read_text(), flags=re.M)}
    files = set(re.findall(r"\b(test_\w+\.py)\b", table))
    assert named and files
    assert named <= defined, sorted(named - defined)
    assert all((REPO / "tests" / name).is_file() for name in files), files
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| case")
            and not line.startswith("| status") and not re.match(r"\| \d+ \|", line)]
    assert all("test_" in row for row in rows), [row[:80] for row in rows if "test_" not in row]
