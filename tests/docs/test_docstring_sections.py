"""The API reference documents every argument: each public callable's docstring has Google-style sections.

The site renders ``Args:`` / ``Returns:`` / ``Raises:`` sections as tables (mkdocs.yml:
``docstring_style: google``, ``docstring_section_style: table``), parsed by griffe, the parser mkdocstrings
uses. A public callable is a class or function of ``drivetrain.__all__`` or ``drivetrain.loggers.__all__``
and every public method its class defines; a class documents its constructor's arguments in its own
docstring (the reference merges ``__init__`` into the class). Each must:

- name every parameter (``self`` and ``cls`` aside) in ``Args:``, under its own name (``*args``, ``**kwargs``
  as written), and nothing that is not a parameter;
- have a ``Returns:`` (or ``Yields:``) section when it returns something (its annotation is not ``None``).

A method without an ``Args:`` section of its own reads the one of the method it overrides (a callback's
``on_train_begin`` the one of ``Callback.on_train_begin``), as ``help()`` reads an inherited docstring.
An argument whose name starts with ``_`` is for drivetrain's own callers and is not listed. In the other public
modules (``drivetrain.backend``, ``drivetrain.testing``) a documented argument must still be a parameter.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator

import pytest

from .test_docstrings import public_objects

griffe = pytest.importorskip("griffe", reason="the docs env installs griffe with mkdocstrings-python")

COMPLETE = ("drivetrain", "drivetrain.loggers")
NAMES_ONLY = ("drivetrain.backend", "drivetrain.testing")
NO_VALUE = {"None", "NoReturn", "Never"}


def callables(module_names: tuple[str, ...]) -> Iterator[tuple[str, Callable, str, bool]]:
    """``(name, callable, docstring, is_constructor)`` of every public class, function and method."""
    for qualified, obj in public_objects().items():
        if qualified.rsplit(".", 1)[0] not in module_names:
            continue
        if not inspect.isclass(obj):
            yield qualified, obj, inspect.getdoc(obj) or "", False
            continue
        if issubclass(obj, BaseException):
            continue  # an error's arguments are its message, built where it is raised
        if obj.__init__ is not object.__init__:
            yield qualified, obj, obj.__dict__.get("__doc__") or "", True
        for name, member in vars(obj).items():
            function = getattr(member, "__func__", member)
            if name.startswith("_") or not inspect.isfunction(function):
                continue
            yield f"{qualified}.{name}", getattr(obj, name), _method_doc(obj, name), False


def _method_doc(cls: type, name: str) -> str:
    """The method's docstring; an override without an ``Args:`` section reads the one of the method it overrides."""
    own = inspect.getdoc(getattr(cls, name)) or ""
    if "parameters" in sections(own):
        return own
    for base in cls.__mro__[1:]:
        if name in vars(base) and "parameters" in sections(inspect.getdoc(getattr(base, name)) or ""):
            return inspect.getdoc(getattr(base, name)) or ""
    return own


def _parameters(function: Callable) -> list[str]:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return []
    names = []
    for parameter in signature.parameters.values():
        if parameter.name in ("self", "cls") or parameter.name.startswith("_"):
            continue  # a leading underscore marks an argument for drivetrain's own callers
        stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
        names.append(stars + parameter.name)
    return names


def _returns_value(function: Callable, is_constructor: bool) -> bool:
    if is_constructor:
        return False
    try:
        annotation = inspect.signature(function).return_annotation
    except (TypeError, ValueError):
        return False
    if annotation is inspect.Signature.empty:
        return False
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    return text not in NO_VALUE and annotation is not None


def sections(docstring: str) -> dict[str, list[str]]:
    """``{section kind: documented names}`` of a docstring as griffe's Google parser reads it."""
    logging.getLogger("griffe").setLevel(logging.ERROR)
    parsed = griffe.Docstring(docstring).parse("google", returns_multiple_items=False)
    found: dict[str, list[str]] = {}
    for section in parsed:
        kind = section.kind.value
        names = [getattr(item, "name", "") for item in section.value] if isinstance(section.value, list) else []
        found.setdefault(kind, []).extend(names)
    return found


def problems(module_names: tuple[str, ...], *, complete: bool) -> list[str]:
    """One line per missing, misnamed or unexpected entry of the callables of ``module_names``."""
    found = []
    for name, function, docstring, is_constructor in callables(module_names):
        parsed = sections(docstring)
        expected = _parameters(function.__init__ if is_constructor else function)  # type: ignore[misc]
        documented = [n if n.lstrip("*") not in expected else n.lstrip("*") for n in parsed.get("parameters", [])]
        bare = [n.lstrip("*") for n in expected]
        wrong = [n for n in documented if n.lstrip("*") not in bare]
        if wrong:
            found.append(f"{name}: documents {wrong}, which it does not take (parameters: {expected})")
        if not complete:
            continue
        missing = [n for n in expected if n.lstrip("*") not in {d.lstrip("*") for d in documented}]
        if missing:
            found.append(f"{name}: Args: lacks {missing}")
        if _returns_value(function, is_constructor) and not ({"returns", "yields"} & set(parsed)):
            found.append(f"{name}: no Returns: section")
    return found


def test_the_checker_reads_google_sections() -> None:
    def sample(a: int, *rest: int, b: str = "", **options: int) -> int:
        """Add.

        Args:
            a: first.
            *rest: more.
            b: a label.
            **options: extras.

        Returns:
            The sum.

        Raises:
            ValueError: never.
        """
        return a

    assert sections(sample.__doc__ or "") == {"text": [], "parameters": ["a", "*rest", "b", "**options"],
                                              "returns": [""], "raises": [""]}
    assert _parameters(sample) == ["a", "*rest", "b", "**options"]


def test_every_public_argument_and_return_value_is_documented() -> None:
    found = problems(COMPLETE, complete=True)
    assert not found, f"{len(found)} docstrings to complete:\n" + "\n".join(found)


def test_documented_arguments_of_the_backend_api_exist() -> None:
    found = problems(NAMES_ONLY, complete=False)
    assert not found, "\n".join(found)
