"""Signatures written out on a page are the code's: names, order, keyword-only marker and defaults.

A page lists a full signature as a code block or an inline code span holding just the call
(``Trainer(model, train_dataloader, optimizers=None, ...)``, ``trainer.run(...)``,
``CheckpointCallback(folder, *, every_n_batches=None, ...)``). Each such listing is compared with
``inspect.signature`` of the public callable it names, so a renamed argument or a changed default
cannot leave the page behind. An example call with a few chosen values is not a listing: a listing
names every parameter.
"""

from __future__ import annotations

import inspect
import re

import drivetrain

from .test_examples import _page_id, code_blocks, doc_pages

CALL = re.compile(r"^\s*(?P<name>trainer\.run|[A-Za-z_]\w*)\((?P<args>.*)\)\s*$", re.DOTALL)
PARAM = re.compile(r"^(?P<stars>\*{0,2})(?P<name>\w*)(?:=(?P<default>.+))?$", re.DOTALL)


def callables() -> dict[str, object]:
    found = {name: getattr(drivetrain, name) for name in drivetrain.__all__ if callable(getattr(drivetrain, name))}
    found["trainer.run"] = drivetrain.Trainer.run
    return found


def _split(args: str) -> list[str]:
    """Top-level comma-separated parts of an argument list."""
    parts, depth, current = [], 0, ""
    for char in args:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def listings() -> list[tuple[str, str, list[str]]]:
    """``(where, callable name, parameter texts)`` of every full signature listing in docs/."""
    known = callables()
    found = []
    for page in doc_pages():
        text = page.read_text(encoding="utf-8")
        candidates = [(b.line, b.code) for b in code_blocks(text) if b.info != "python"]
        candidates += [(text.count("\n", 0, m.start()) + 1, m[1]) for m in re.finditer(r"`([^`\n]+\))`", text)]
        for line, code in candidates:
            match = CALL.match(code)
            if match is None or match["name"] not in known:
                continue
            parts = _split(" ".join(match["args"].split()))
            if not parts or not all(PARAM.match(p) for p in parts):
                continue
            signature = inspect.signature(known[match["name"]])
            own = [p for p in signature.parameters if p != "self"]
            if len([p for p in parts if p != "*"]) == len(own):  # every parameter named: a listing
                found.append((f"{_page_id(page)}:{line}", match["name"], parts))
    return found


def _written(parameter: inspect.Parameter) -> str:
    if parameter.kind is inspect.Parameter.VAR_KEYWORD:
        return "**"
    if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
        return "*" + parameter.name
    if parameter.default is inspect.Parameter.empty:
        return parameter.name
    return f"{parameter.name}={parameter.default!r}".replace("'", '"')


def expected_parts(function: object) -> list[str]:
    """The signature as a page writes it: ``*`` before the first keyword-only parameter, double quotes."""
    parts = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name == "self":
            continue
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in parts and not any(
                p.startswith("*") for p in parts):
            parts.append("*")
        parts.append(_written(parameter))
    return parts


def test_the_pages_list_the_main_signatures() -> None:
    named = {name for _, name, _ in listings()}
    assert {"Trainer", "trainer.run", "CheckpointCallback"} <= named, named


def test_listed_signatures_match_the_code() -> None:
    known = callables()
    wrong = []
    for where, name, parts in listings():
        written = [("**" if p.startswith("**") else p.replace("'", '"')) for p in parts]
        expected = expected_parts(known[name])
        if written != expected:
            wrong.append(f"{where}: {name}({', '.join(parts)})\n    the code: {name}({', '.join(expected)})")
    assert not wrong, "signatures on the pages differ from the code:\n" + "\n".join(wrong)
