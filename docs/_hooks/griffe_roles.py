"""griffe extension: drivetrain's docstrings read as Markdown in the API reference.

The docstrings are written for ``help()`` and editors, in reStructuredText habits: Sphinx roles
(``:class:`Trainer```, ``:meth:`~drivetrain.Trainer.run```) and ``::`` before an indented example.
Markdown would show the roles literally; this turns each into a code span naming the object (its last
component under ``~``) and ``::`` into ``:``. The text of the docstrings is not changed.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj|const):`(?P<tilde>~?)(?P<target>[^`]+)`")
LITERAL = re.compile(r"(?<=\S)::$", re.MULTILINE)


def markdown_docstring(text: str) -> str:
    """``text`` with Sphinx roles as code spans and ``::`` literal markers as ``:``."""
    def span(match: re.Match) -> str:
        target = match["target"]
        return f"`{target.rsplit('.', 1)[-1] if match['tilde'] else target}`"

    return LITERAL.sub(":", ROLE.sub(span, text))


class SphinxRolesToMarkdown(griffe.Extension):
    """Rewrite each loaded object's docstring with :func:`markdown_docstring`."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Called by griffe for every object it loads."""
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
