"""The documentation cannot go stale: the site builds in strict mode, its examples and the README's run.

Pages whose examples need Spark run in tests/spark/test_docs_examples.py; see doc_examples.py for the
conventions (``<!-- docs-test: spark -->``, ``<!-- skip: REASON -->``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
from doc_examples import DOCS, ROOT, pages, run_page, unexplained_skips

LOCAL_PAGES = [p for p in pages() if not p.needs_spark]
# what a user imports: each has its page in the API reference (docs/reference/*.md, `::: module`)
PUBLIC_MODULES = [
    "sparkgrad",
    "sparkgrad.compress",
    "sparkgrad.cuda",
    "sparkgrad.data",
    "sparkgrad.datasets",
    "sparkgrad.device",
    "sparkgrad.errors",
    "sparkgrad.eval",
    "sparkgrad.ml",
    "sparkgrad.mlflow",
    "sparkgrad.nn",
    "sparkgrad.nn.schedules",
    "sparkgrad.nn.updaters",
    "sparkgrad.parallel",
    "sparkgrad.spark",
    "sparkgrad.transport",
]
# the package's modules that are not imported by users: the command line and the native module loader
NOT_API = {"cli"}


def _mkdocs_missing() -> str | None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except ModuleNotFoundError:
            return module
    return None


@pytest.mark.skipif(
    _mkdocs_missing() is not None,
    reason=f"{_mkdocs_missing()} is not installed (mkdocs-material and mkdocstrings[python] come with the "
    "test extra)",
)
def test_site_builds_in_strict_mode(tmp_path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's banner about MkDocs 2 is not a warning
    # the build must not need the network: a fetch goes to a closed port and fails the build
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env[proxy] = "http://127.0.0.1:9"
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output
    reference = (tmp_path / "site" / "reference" / "spark" / "index.html").read_text(encoding="utf-8")
    assert 'id="sparkgrad.spark.SharedTrainingMaster"' in reference  # mkdocstrings rendered the API


def test_api_reference_covers_every_public_module() -> None:
    documented = set()
    for page in (DOCS / "reference").glob("*.md"):
        documented |= set(re.findall(r"^::: ([\w.]+)\s*$", page.read_text(encoding="utf-8"), re.MULTILINE))
    assert sorted(set(PUBLIC_MODULES) - documented) == []
    package = ROOT / "python" / "sparkgrad"
    top_level = {p.stem for p in package.glob("*.py")} | {p.name for p in package.iterdir() if p.is_dir()}
    top_level = {m for m in top_level if not m.startswith("_") and m not in NOT_API | {"__pycache__"}}
    assert sorted(f"sparkgrad.{m}" for m in top_level if f"sparkgrad.{m}" not in documented) == []


@pytest.mark.parametrize("page", LOCAL_PAGES, ids=[p.name for p in LOCAL_PAGES])
def test_page_examples_run(page, tmp_path) -> None:
    run_page(page, tmp_path)


def test_skipped_examples_say_why_on_the_page() -> None:
    assert {p.name: unexplained_skips(p) for p in pages() if unexplained_skips(p)} == {}


def test_readme_is_short_and_keeps_the_ci_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 200
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = ci.split("# --- README test command (keep identical to README.md) ---\n", 1)[1].strip()
    assert f"```bash\n{command}\n```" in readme
    assert '```bash\npip install ".[demo]" && sparkgrad demo\n```' in readme
    # relative links into the docs work on GitHub too: each names a file that exists
    for target in re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", readme):
        assert (ROOT / target).is_file(), target
