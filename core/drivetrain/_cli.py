"""``drivetrain`` command line.

``drivetrain --version`` prints the installed version.
``drivetrain backends`` lists the installed backends, their contract compatibility and the
plugins that were refused; ``drivetrain backends --check NAME`` runs the conformance checks
of ``drivetrain.testing`` on one installed backend and prints a pass/fail table per group.
``drivetrain plot RUN_DIR ... [-o PATH]`` draws the curves of one or several run records (default: RUN_DIR/curves.png).
``drivetrain export CKPT [-o model.safetensors] [--base BASE]`` writes a checkpoint's model weights as one safetensors
file (with ``--base``, a LoRA adapter folded into its base model's weights).
``drivetrain convert FOLDER --to paddle -o OUT`` writes a model folder of another framework as driver paddle's.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from ._common import __version__
from .backend import (
    CONTRACT_VERSION,
    KNOWN_BACKENDS,
    contract_problem,
    driver_not_found,
    get_registry,
    known_install,
)


def _backends(out: TextIO) -> int:
    registry = get_registry()
    write = out.write
    write(f"drivetrain driver contract version {CONTRACT_VERSION}\n")
    if not registry.specs:
        write("no drivers installed\n")
    for name, spec in sorted(registry.specs.items()):
        caps = spec.capabilities
        framework = "installed" if spec.framework_installed() else f"MISSING ({spec.install_command})"
        problem = contract_problem(spec)
        write(f"\n{name}\n")
        write(f"  package:      {spec.distribution or '-'} {spec.version() or ''}\n")
        write(f"  framework:    {spec.framework} ({framework})\n")
        write(f"  contract:     {list(spec.contract_versions)} (compatible: {'NO' if problem else 'yes'})\n")
        if problem:
            write(f"  fix:          {problem}\n")
        write(f"  precisions:   {', '.join(caps.precisions)}\n")
        write(f"  devices:      {', '.join(caps.devices)}\n")
        write(f"  distributed:  {', '.join(caps.distributed) or 'no'}\n")
        write(f"  checks:       {'drivetrain backends --check ' + name if spec.testing_kit else 'no testing kit'}\n")
        for key, note in caps.notes.items():
            write(f"  note {key}: {note}\n")
    if registry.skipped:
        write("\nleft out by DRIVETRAIN_PLUGINS_ALLOW/DRIVETRAIN_PLUGINS_DENY: "
              + ", ".join(f"{n} ({dist})" for n, dist in sorted(registry.skipped.items())) + "\n")
    missing = [n for n in KNOWN_BACKENDS if n not in registry.specs and n not in registry.skipped]
    if missing:
        write("\nnot installed: " + ", ".join(missing) + "\n")
        for name in missing:
            write(f"  {name}: {known_install(name)}\n")
    if registry.broken:
        write("\nrefused plugins (skipped):\n")
        for name, error in registry.broken.items():
            write(f"  {name}: {error}\n")
    return 1 if registry.broken else 0


def _check(name: str, out: TextIO) -> int:
    """Run the contract checks on backend ``name``: 0 all passed, 1 some failed, 2 could not run."""
    from .testing import GROUPS, checked_waivers, kit_for, run_contract_checks

    spec = get_registry().specs.get(name)
    try:
        if spec is None:
            raise driver_not_found(name)
        problem = contract_problem(spec)
        if problem:
            raise LookupError(problem)
        kit = kit_for(name)
        checked_waivers(kit)
    except Exception as exc:
        out.write(f"cannot check {name!r}: {exc}\n")
        return 2
    out.write(f"contract checks for {name!r} ({spec.distribution or '-'} {spec.version() or ''}, "
              f"framework {spec.framework}), driver contract version {CONTRACT_VERSION}\n\n")
    results = run_contract_checks(kit)
    width = max(len(group) for group in GROUPS)
    out.write(f"{'group'.ljust(width)}  result  passed\n")
    for group in GROUPS:
        mine = [r for r in results if r.check.group == group and r.waived is None]
        if not mine:
            continue
        passed = sum(r.passed for r in mine)
        verdict = "PASS" if passed == len(mine) else "FAIL"
        seconds = sum(r.seconds for r in mine)
        out.write(f"{group.ljust(width)}  {verdict:6}  {passed}/{len(mine)}  ({seconds:.2f} s)\n")
    failures = [r for r in results if r.error is not None]
    for result in failures:
        out.write(f"\nFAILED {result.check.name}: {result.error}\n")
    waived = [r for r in results if r.waived is not None]
    for result in waived:
        out.write(f"\nWAIVED {result.check.name} ([{result.check.group}] {result.check.rule}): {result.waived}\n")
    ran = len(results) - len(waived)
    out.write(f"\n{ran - len(failures)}/{ran} checks passed" + (f", {len(waived)} waived by the kit" if waived else "")
              + "\n")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="drivetrain", description="drivetrain utilities")
    parser.add_argument("--version", action="version", version=f"drivetrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    backends = sub.add_parser("backends", help="list installed backends, their versions, capabilities and "
                              "refused plugins; --check NAME runs the conformance checks on one")
    backends.add_argument("--check", metavar="NAME", help="run drivetrain.testing's contract checks on backend NAME")
    plot = sub.add_parser("plot", help="draw loss, learning rate and evaluation metrics of run records "
                          "(several folders: overlaid)")
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a folder holding metrics.jsonl or metrics.csv")
    plot.add_argument("-o", "--output", default=None, help="the image to write (default: curves.png in the first "
                      "RUN_DIR, beside its record)")
    export = sub.add_parser("export", help="write the model weights of a checkpoint as one safetensors file "
                            "(names as the model's state_dict keys)")
    export.add_argument("checkpoint", metavar="CKPT", help="a checkpoint or save_model folder, or a folder of "
                        "checkpoints (the newest is taken)")
    export.add_argument("-o", "--output", default="model.safetensors",
                        help="the file to write, or a folder to write model.safetensors into "
                        "(default: model.safetensors)")
    export.add_argument("--base", metavar="BASE", help="for a LoRA adapter folder (save_model of a peft model): the "
                        "base model's safetensors file or from_pretrained folder; writes the base with the adapter "
                        "folded in")
    convert = sub.add_parser("convert", help="write a model folder (or exported file) of one framework as a model "
                             "folder of another, by the backends' weight layout rules")
    convert.add_argument("source", metavar="FOLDER", help="a save_model/checkpoint folder, a file from drivetrain "
                         "export, or a plain .safetensors file (with --from)")
    convert.add_argument("--to", required=True, metavar="DRIVER", help="the driver to write for: paddle, torch, "
                         "jittor, oneflow or any installed driver")
    convert.add_argument("-o", "--output", required=True, metavar="OUT", help="the model folder to write")
    convert.add_argument("--from", dest="source_driver", metavar="DRIVER", help="the driver whose layout FOLDER is "
                         "in, for a .safetensors file that does not say (torch for a Hugging Face file)")
    args = parser.parse_args(argv)
    if args.command == "backends":
        return _check(args.check, sys.stdout) if args.check else _backends(sys.stdout)
    if args.command == "plot":
        return _plot(args.run_dirs, args.output, sys.stdout)
    if args.command == "export":
        return _export(args.checkpoint, args.output, sys.stdout, args.base)
    if args.command == "convert":
        return _convert(args.source, args.to, args.output, sys.stdout, args.source_driver)
    return 2


def _export(checkpoint: str, output: str, out: TextIO, base: str | None = None) -> int:
    from ._checkpoint import export_weights
    from ._common import DrivetrainError

    try:
        path = export_weights(checkpoint, output, base=base)
    except (DrivetrainError, OSError, ValueError) as exc:
        message = str(exc).replace("export_weights(checkpoint=", "CKPT (").replace("export_weights(out=", "-o (")
        print(f"drivetrain export: {message}", file=sys.stderr)
        return 1
    print(f"wrote {path}", file=out)
    return 0


def _convert(source: str, to: str, output: str, out: TextIO, source_driver: str | None = None) -> int:
    from ._common import DrivetrainError
    from ._convert import convert_weights

    try:
        path = convert_weights(source, to, output, source_driver=source_driver)
    except (DrivetrainError, OSError, ValueError) as exc:
        message = str(exc).replace("source_driver=", "--from ")
        print(f"drivetrain convert: {message}", file=sys.stderr)
        return 1
    print(f"wrote {path} (load it with driver {to!r}: trainer.load_model or drivetrain.load_weights)", file=out)
    return 0


def _plot(run_dirs: list[str], output: str | None, out: TextIO) -> int:
    from ._common import ConfigurationError
    from ._records import DEFAULT_NAME, plot_runs

    try:
        path = plot_runs(run_dirs, output or os.path.join(run_dirs[0], DEFAULT_NAME))
    except ConfigurationError as exc:
        print(f"drivetrain plot: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path}", file=out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
