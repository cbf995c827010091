"""``python -m drivetrain`` runs the ``drivetrain`` command (for environments whose scripts are not on PATH)."""

from ._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
