"""mkdocs hook: the docstrings' Sphinx roles (``:class:`~a.b.C```) shown as code, as Sphinx shows them.

The API reference renders the docstrings as Markdown, where a role stays literal text before its code span
(``:class:<code>~a.b.C</code>``).  This drops the role and, after ``~``, the dotted path, so the page reads
``C``.  mkdocs.yml names this file under ``hooks``.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const):<code>(~?)([^<]*)</code>")


def _shown(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"<code>{target.rpartition('.')[2] if tilde else target}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    """Replace every role and its code span in a page's HTML by the code span alone."""
    return _ROLE.sub(_shown, html)
