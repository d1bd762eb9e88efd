"""MkDocs hook: the Sphinx roles of the docstrings (:class:`~sparkgrad.spark.SparkNetwork`) as links.

The docstrings use reStructuredText roles, which Markdown leaves as text (":class:" then the code). This
hook removes the role, shortens a ``~``-prefixed path to its last name, and wraps a dotted
``sparkgrad.`` path in an optional autorefs reference, so it links to the API reference when the
object is documented there (and stays plain code when it is not: no warning).
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([\w.]+)</code>")


def _link(match: re.Match[str]) -> str:
    short, path = match.group(1) == "~", match.group(2)
    shown = path.rsplit(".", 1)[-1] if short else path
    if not path.startswith("sparkgrad."):
        return f"<code>{shown}</code>"
    return f'<autoref identifier="{path}" optional><code>{shown}</code></autoref>'


def on_page_content(html: str, **kwargs: object) -> str:
    return _ROLE.sub(_link, html)
