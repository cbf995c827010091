"""How messages name a class: by the shortest import path that reaches it, as its users write it.

Why: a class's ``__module__`` is where it is defined, often a private module (``torch.optim.sgd.SGD``,
``paddle.optimizer.sgd.SGD``); people know it by the package that exports it (``torch.optim.SGD``).
Only modules already imported are searched, so naming a class never imports a framework.
"""

from __future__ import annotations

import sys


def public_name(cls: type) -> str:
    """``cls`` as ``package.Name`` from the shortest already-imported parent of its module that exports it."""
    module = getattr(cls, "__module__", None) or "builtins"
    qualname = getattr(cls, "__qualname__", getattr(cls, "__name__", repr(cls)))
    parts = module.split(".")
    for end in range(1, len(parts)):
        parent = sys.modules.get(".".join(parts[:end]))
        if parent is not None and getattr(parent, qualname, None) is cls:
            return f"{'.'.join(parts[:end])}.{qualname}"
    return f"{module}.{qualname}"
