"""The user guide's errors table lists every error class drivetrain exports, with its builtin base."""

from __future__ import annotations

import re
from pathlib import Path

import drivetrain

TRAINER_PAGE = Path(__file__).resolve().parents[2] / "docs" / "user-guide" / "trainer.md"


def table_rows() -> dict[str, str]:
    """``{error name: builtin base}`` from the rows of the table under '## Errors'."""
    text = TRAINER_PAGE.read_text(encoding="utf-8")
    section = text[text.index("## Errors"):]
    return dict(re.findall(r"^\| `(\w+)` \|\s*`?(\w*)`?\s*\|", section, flags=re.MULTILINE))


def test_every_exported_error_has_a_row_with_its_builtin_base() -> None:
    rows = table_rows()
    exported = {name: getattr(drivetrain, name) for name in drivetrain.__all__}
    errors = {name: cls for name, cls in exported.items()
              if isinstance(cls, type) and issubclass(cls, drivetrain.DrivetrainError) and cls is not drivetrain.DrivetrainError}
    missing = sorted(set(errors) - set(rows))
    assert not missing, f"docs/user-guide/trainer.md's errors table has no row for {missing}"
    for name, cls in errors.items():
        builtin = next(base.__name__ for base in cls.__mro__ if base.__module__ == "builtins" and base is not object)
        assert rows[name] == builtin, f"{name} derives from {builtin}, the table says {rows[name]!r}"
