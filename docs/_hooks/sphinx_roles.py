"""MkDocs hook: the reStructuredText left in docstrings, rendered as the docstrings mean it.

- Sphinx roles (:class:`~sparkgrad.spark.SparkNetwork`), which Markdown leaves as text (":class:" then
  the code): the role goes, a ``~``-prefixed path is shortened to its last name, and a dotted
  ``sparkgrad.`` path becomes an optional autorefs reference, a link when the object is documented in
  the API reference (plain code when it is not: no warning).
- Simple tables (a paragraph that starts with a ``====== =====`` border, as in the wire format's
  header layout): shown preformatted, so their columns line up.
"""

from __future__ import annotations

import re

_TABLE = re.compile(r"<p>(=+(?: +=+)+\n.*?)</p>", re.DOTALL)
_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([\w.]+)</code>")


def _link(match: re.Match[str]) -> str:
    short, path = match.group(1) == "~", match.group(2)
    shown = path.rsplit(".", 1)[-1] if short else path
    if not path.startswith("sparkgrad."):
        return f"<code>{shown}</code>"
    return f'<autoref identifier="{path}" optional><code>{shown}</code></autoref>'


def on_page_content(html: str, **kwargs: object) -> str:
    html = _TABLE.sub(r"<pre><code>\1</code></pre>", html)
    return _ROLE.sub(_link, html)
