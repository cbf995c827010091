"""griffe extension: the API reference shows the members drivetrain makes at import, one per event.

``Event.on_train_begin(...)`` and ``Callback.on_train_begin(self, trainer)`` are not written in the source:
``_events.py`` and ``_callbacks.py`` make one per event in a loop, with a docstring (``Args:`` and all) and,
for the callback hooks, the signature the event calls them with. griffe reads the source, so it would not list
them; this adds each to its class from the imported object, so the reference documents every event.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe

LIVE = {"drivetrain._callbacks.events.Event", "drivetrain._callbacks.base.Callback"}


def _parameters(function: Any) -> griffe.Parameters:
    """``function``'s signature as griffe parameters (inspect's kind descriptions are griffe's kind values)."""
    parameters = []
    for parameter in inspect.signature(function).parameters.values():
        default = None if parameter.default is inspect.Parameter.empty else repr(parameter.default)
        annotation = None if parameter.annotation is inspect.Parameter.empty else str(parameter.annotation)
        parameters.append(griffe.Parameter(parameter.name, kind=griffe.ParameterKind(parameter.kind.description),
                                           annotation=annotation, default=default))
    return griffe.Parameters(*parameters)


class LiveMembers(griffe.Extension):
    """Add the imported class's generated ``on_*`` functions to the classes of :data:`LIVE`."""

    def on_class(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        """Called by griffe for every class it loads."""
        if cls.path not in LIVE:
            return
        module_name, _, class_name = cls.path.rpartition(".")
        live = getattr(importlib.import_module(module_name), class_name)
        for name, member in vars(live).items():
            function = getattr(member, "__func__", member)
            if not name.startswith("on_") or name in cls.members or not inspect.isfunction(function):
                continue
            docstring = griffe.Docstring(inspect.getdoc(function) or "", parent=None,
                                         parser=cls.docstring.parser if cls.docstring else None,
                                         parser_options=cls.docstring.parser_options if cls.docstring else None)
            signature = inspect.signature(getattr(live, name))
            returns = None if signature.return_annotation is inspect.Signature.empty else str(signature.return_annotation)
            added = griffe.Function(name, parameters=_parameters(getattr(live, name)), returns=returns,
                                    docstring=docstring, lineno=cls.lineno, endlineno=cls.lineno)
            if isinstance(member, staticmethod):
                added.labels.add("staticmethod")
            cls.set_member(name, added)
            docstring.parent = added
