"""MkDocs hook: turn the Sphinx roles left in rendered docstrings into cross-references.

The library's docstrings use reStructuredText roles (``:class:`~sqla_queue.JobContext```),
which mkdocstrings passes through as text: ``:class:<code>~sqla_queue.JobContext</code>``.
This hook rewrites each one as an optional mkdocs-autorefs reference, resolved (or left as
plain code when there is no target) after every page is rendered. As in Sphinx, a leading
``~`` shows only the last component of the name.
"""

from __future__ import annotations

import html
import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|attr|data|exc|mod|obj):<code>(~?)([\w.]+)</code>")


def _reference(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    shown = target.rsplit(".", 1)[-1] if tilde else target
    # Relative names in the docstrings are relative to the package's public namespace.
    identifier = target if target.startswith("sqla_queue") else f"sqla_queue.{target}"
    return (
        f'<autoref identifier="{html.escape(identifier)}" optional>'
        f"<code>{html.escape(shown)}</code></autoref>"
    )


def on_page_content(html_text: str, **kwargs: Any) -> str:
    """Rewrite the roles of one rendered page."""
    return _ROLE.sub(_reference, html_text)
