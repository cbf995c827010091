"""``drivetrain`` command line: ``drivetrain backends`` lists what is installed and what is broken."""

from __future__ import annotations

import argparse
import sys

from ._driver import CONTRACT_VERSION
from ._plugins import KNOWN_BACKENDS, get_registry, install_hint


def _backends(out: object) -> int:
    registry = get_registry()
    write = out.write  # type: ignore[attr-defined]
    write(f"drivetrain driver contract version {CONTRACT_VERSION}\n")
    if not registry.specs:
        write("no drivers installed\n")
    for name, spec in sorted(registry.specs.items()):
        caps = spec.capabilities
        framework = "installed" if spec.framework_installed() else f"MISSING ({spec.install_command})"
        compatible = "yes" if CONTRACT_VERSION in spec.contract_versions else "NO"
        write(f"\n{name}\n")
        write(f"  package:      {spec.distribution or '-'} {spec.version() or ''}\n")
        write(f"  framework:    {spec.framework} ({framework})\n")
        write(f"  contract:     {list(spec.contract_versions)} (compatible: {compatible})\n")
        write(f"  precisions:   {', '.join(caps.precisions)}\n")
        write(f"  devices:      {', '.join(caps.devices)}\n")
        write(f"  distributed:  {', '.join(caps.distributed) or 'no'}\n")
        for key, note in caps.notes.items():
            write(f"  note {key}: {note}\n")
    missing = [n for n in KNOWN_BACKENDS if n not in registry.specs]
    if missing:
        write("\nnot installed: " + ", ".join(f"{n} ({install_hint(n)})" for n in missing) + "\n")
    if registry.broken:
        write("\nbroken plugins (skipped):\n")
        for name, error in registry.broken.items():
            write(f"  {name}: {error}\n")
    return 1 if registry.broken else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="drivetrain", description="drivetrain utilities")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("backends", help="list installed backends, their versions, capabilities and broken plugins")
    args = parser.parse_args(argv)
    if args.command == "backends":
        return _backends(sys.stdout)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
