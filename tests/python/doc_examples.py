"""The Python examples of the documentation (docs/**/*.md and README.md), collected so the tests run them.

Every fenced ```python block of a page is an example. The blocks of one page run in order in one
namespace, so a page can build an example up step by step. Two HTML comments, invisible on the rendered
page, steer the tests:

- ``<!-- docs-test: spark -->`` anywhere on a page: its examples need a SparkSession, so they run under
  the ``spark`` marker (tests/spark/test_docs_examples.py, with the session of tests/spark/conftest.py,
  which the examples' ``SparkSession.builder...getOrCreate()`` returns). Other pages run in
  tests/python/test_docs.py.
- ``<!-- skip: REASON -->`` on the line before a block: the block does not run (it needs a cluster or a
  GPU). The page must say so where readers see it: REASON must appear in its visible text.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_FENCE_OPEN = re.compile(r"^```python\s*$")
_FENCE_CLOSE = re.compile(r"^```\s*$")
_SKIP = re.compile(r"^<!--\s*skip:\s*(.+?)\s*-->\s*$")
_SPARK = re.compile(r"<!--\s*docs-test:\s*spark\s*-->")
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


@dataclass(frozen=True)
class Example:
    """One ```python block: its first code line (1-based) in the page, its code, why it is skipped."""

    line: int
    code: str
    skip: str | None


@dataclass
class Page:
    """A Markdown page and its examples, in order."""

    path: Path
    examples: list[Example] = field(default_factory=list)
    needs_spark: bool = False

    @property
    def name(self) -> str:
        return self.path.relative_to(ROOT).as_posix()


def parse_page(path: Path) -> Page:
    """The examples of ``path``; a fence left open is an error naming the page and line."""
    text = path.read_text(encoding="utf-8")
    page = Page(path, needs_spark=_SPARK.search(text) is not None)
    lines = text.splitlines()
    previous = ""  # the last non-blank line before the current one
    i = 0
    while i < len(lines):
        line = lines[i]
        if _FENCE_OPEN.match(line):
            start = i + 1
            end = start
            while end < len(lines) and not _FENCE_CLOSE.match(lines[end]):
                end += 1
            if end == len(lines):
                raise ValueError(f"{page.name}:{i + 1}: ```python block is never closed")
            skip = _SKIP.match(previous)
            page.examples.append(Example(start + 1, "\n".join(lines[start:end]), skip and skip.group(1)))
            i = end + 1
            previous = ""
            continue
        if line.strip():
            previous = line.strip()
        i += 1
    return page


def pages() -> list[Page]:
    """Every documentation page with at least one Python example, README.md last."""
    found = [parse_page(p) for p in sorted(DOCS.rglob("*.md"))] + [parse_page(ROOT / "README.md")]
    return [p for p in found if p.examples]


def unexplained_skips(page: Page) -> list[str]:
    """Skip reasons of ``page`` that its visible text (outside HTML comments) does not state."""
    visible = _COMMENT.sub("", page.path.read_text(encoding="utf-8"))
    return [e.skip for e in page.examples if e.skip and e.skip not in visible]


def run_page(page: Page, workdir: Path, replace: dict[str, str] | None = None) -> dict[str, Any]:
    """Run every example of ``page`` that is not skipped, in order, in one namespace, with ``workdir`` as
    the current directory (files an example writes land there). ``replace`` substitutes text in the
    code first; each key must occur. Returns the namespace."""
    namespace: dict[str, Any] = {"__name__": "__docs_example__"}
    pending = dict(replace or {})
    with _cwd(workdir):
        for example in page.examples:
            if example.skip:
                continue
            code = example.code
            for old, new in list(pending.items()):
                if old in code:
                    code = code.replace(old, new)
                    del pending[old]
            # leading newlines keep traceback line numbers equal to the page's
            source = "\n" * (example.line - 1) + code
            exec(compile(source, str(page.path), "exec"), namespace)
    assert not pending, f"{page.name}: text to replace not found in its examples: {sorted(pending)}"
    return namespace


@contextmanager
def _cwd(path: Path) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)
