"""The framework-neutral half of the loop-overhead benchmarks (``bench/overhead*.py``).

Each ``overhead_<framework>.py`` describes its framework in a :class:`Framework`
(workloads, how to copy a model and build its optimizer, the hand-written loop) and
calls :func:`main`. Everything else is here once: interleaved rounds, time and
callgrind meters, medians and paired ratios, the table and the JSON.

Both sides train the same model from the same initial weights on the same pre-built
list of ``{"x": tensor, "target": tensor}`` batches, with SGD, in the Trainer's order;
the warm-up checks that both end with bit-identical weights. Building the Trainer is
not measured; ``run()`` is, whole. This is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from drivetrain import Trainer

SEED = 0
LR = 0.01


@dataclass
class Workload:
    describe: str
    make_model: Callable[[], Any]
    make_batches: Callable[[int], list[dict[str, Any]]]


@dataclass
class Framework:
    """What the harness needs to know about one framework."""

    name: str
    version: str
    driver: str
    workloads: dict[str, Workload]
    copy_model: Callable[[Any], Any]
    """A fresh model with the same weights as the given one."""
    make_optimizer: Callable[[Any, float], Any]
    hand_step: Callable[[Any, Any, dict[str, Any]], None]
    """One hand-written training step: forward, backward, step, clear the gradients."""
    prepare_hand: Callable[[Any, Any], None]
    """Called once before the hand loop (train mode, gradients cleared)."""
    same_weights: Callable[[Any, Any], bool]
    setup_line: str = ""
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------- meters
class TimeMeter:
    """Wall time and CPU time of this process (CPU time does not count time lost to other processes)."""

    metrics = ("cpu", "wall")
    unit = "µs/step"

    def start(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self, steps: int) -> dict[str, float]:
        wall, cpu = time.perf_counter() - self._wall, time.process_time() - self._cpu
        return {"cpu": cpu / steps * 1e6, "wall": wall / steps * 1e6}


class CallgrindMeter:
    """Instructions executed, counted by valgrind's callgrind: deterministic, immune to machine load.

    The process must run under ``valgrind --tool=callgrind --instr-atstart=no
    --callgrind-out-file=OUT``; counting is switched on around each measured loop with
    ``callgrind_control`` and each loop's total is read back from the dump it writes
    (``OUT.1``, ``OUT.2``, ...).
    """

    metrics = ("instructions",)
    unit = "instr/step"

    def __init__(self, out_file: str) -> None:
        self.out_file = out_file
        self.dumps = 0

    def _control(self, *args: str) -> None:
        done = subprocess.run(["callgrind_control", *args, str(os.getpid())], capture_output=True, text=True)
        if done.returncode != 0 or "Error" in done.stdout + done.stderr:
            raise SystemExit(f"callgrind_control {' '.join(args)} failed: is this process running under "
                             f"valgrind --tool=callgrind --instr-atstart=no?\n{done.stdout}{done.stderr}")

    def start(self) -> None:
        self._control("--zero")
        self._control("--instr=on")

    def stop(self, steps: int) -> dict[str, float]:
        self._control("--instr=off")
        self._control("--dump")
        self.dumps += 1
        with open(f"{self.out_file}.{self.dumps}", encoding="utf-8") as fh:
            totals = [line for line in fh if line.startswith("totals:")]
        return {"instructions": int(totals[-1].split()[1]) / steps}


Meter = TimeMeter | CallgrindMeter


# ------------------------------------------------------------------ the sides
def hand_loop(fw: Framework, model: Any, optimizer: Any, batches: list[dict], meter: Meter) -> dict[str, float]:
    """The reference: what a user would write by hand."""
    fw.prepare_hand(model, optimizer)
    step = fw.hand_step
    meter.start()
    for batch in batches:
        step(model, optimizer, batch)
    return meter.stop(len(batches))


RECORD_EVERY = [1]  # set by --records-every


def trainer_loop(fw: Framework, model: Any, optimizer: Any, batches: list[dict], meter: Meter,
                 progress_bar: Any = None, records: bool = False) -> dict[str, float]:
    """The same training through ``Trainer.run()``; building the Trainer is not measured.

    ``records``: a CSV and a TensorBoard logger record every ``--records-every`` steps (default 1).
    """
    with tempfile.TemporaryDirectory() as run_dir:
        extra = {"loggers": ["csv", "tensorboard"], "log_every_n_steps": RECORD_EVERY[0], "run_dir": run_dir,
                 "log_level": "warning"} if records else {}
        trainer = Trainer(model, batches, optimizer, driver=fw.driver, device="cpu", n_epochs=1,
                          progress_bar=progress_bar, **fw.trainer_kwargs, **extra)
        with contextlib.redirect_stdout(io.StringIO()):
            meter.start()
            trainer.run(num_eval_sanity_batch=0)
            result = meter.stop(len(batches))
    if trainer.global_forward_batches != len(batches):
        raise SystemExit(f"the Trainer ran {trainer.global_forward_batches} of {len(batches)} steps")
    return result


SIDES: dict[str, tuple[Callable[..., dict[str, float]], dict[str, Any]]] = {
    "hand": (hand_loop, {}),
    "trainer": (trainer_loop, {}),
    "trainer_raw_progress": (trainer_loop, {"progress_bar": "raw"}),
    "trainer_records": (trainer_loop, {"records": True}),
}
SIDE_TITLES = {"trainer": "trainer", "trainer_raw_progress": "raw bar", "trainer_records": "csv+tb"}


# ---------------------------------------------------------------------- running
def measure(fw: Framework, side: str, initial: Any, batches: list[dict], meter: Meter) -> tuple[dict[str, float], Any]:
    """Train a fresh copy of ``initial`` (same weights every time) with a fresh SGD."""
    model = fw.copy_model(initial)
    optimizer = fw.make_optimizer(model, LR)
    gc.collect()
    loop, kwargs = SIDES[side]
    return loop(fw, model, optimizer, batches, meter, **kwargs), model


def summarise(per_round: dict[str, list[float]]) -> dict[str, Any]:
    """Medians per side, and the median of the per-round (paired) trainer/hand ratios and differences."""
    median = {side: statistics.median(v) for side, v in per_round.items()}
    out: dict[str, Any] = {"median": median, "min": {side: min(v) for side, v in per_round.items()}}
    for side, values in per_round.items():
        if side == "hand":
            continue
        pairs = list(zip(values, per_round["hand"], strict=True))
        out[side] = {
            "ratio": median[side] / median["hand"],
            "overhead": median[side] - median["hand"],
            "median_paired_ratio": statistics.median(t / h for t, h in pairs),
            "median_paired_overhead": statistics.median(t - h for t, h in pairs),
        }
    return out


def run_workload(fw: Framework, name: str, steps: int, rounds: int, with_progress: bool,
                 meter: Meter, with_records: bool = False) -> dict[str, Any]:
    spec = fw.workloads[name]
    initial = spec.make_model()
    batches = spec.make_batches(steps)
    # Warm-up (not recorded): the first runs allocate and fill caches (and compile, for jit
    # frameworks). It also checks that both sides do the same computation.
    warm = TimeMeter()
    _, hand_model = measure(fw, "hand", initial, batches[:50], warm)
    _, trainer_model = measure(fw, "trainer", initial, batches[:50], warm)
    if not fw.same_weights(hand_model, trainer_model):
        raise SystemExit(f"{name}: the hand loop and the Trainer ended with different weights; fix the benchmark.")
    if with_records:  # imports the loggers' libraries outside the measured runs
        measure(fw, "trainer_records", initial, batches[:50], warm)
    sides = [s for s in SIDES if (with_progress or s != "trainer_raw_progress")
             and (with_records or s != "trainer_records")]
    per_round: dict[str, dict[str, list[float]]] = {m: {s: [] for s in sides} for m in meter.metrics}
    for r in range(rounds):
        # Interleaved rounds; the order flips every round so drift does not favour one side.
        for side in sides if r % 2 == 0 else reversed(sides):
            result, _ = measure(fw, side, initial, batches, meter)
            for metric, value in result.items():
                per_round[metric][side].append(value)
    return {"workload": name, "describe": spec.describe, "steps": steps, "rounds": rounds, "unit": meter.unit,
            **{metric: summarise(values) for metric, values in per_round.items()}, "per_round": per_round}


def print_table(results: list[dict[str, Any]], meter: Meter) -> None:
    unit = meter.unit
    digits = 0 if unit == "instr/step" else 1
    width = 11 if unit == "instr/step" else 8
    shown = [side for side in SIDE_TITLES if side in results[0][meter.metrics[0]]["median"]]
    print(f"{'':<28} {'':<12}  {'hand':>{width}}" + "".join(
        f"  {SIDE_TITLES[side]:>{width}} {'ratio':>6} {'overhead':>{width}}" for side in shown))
    for res in results:
        for n, metric in enumerate(meter.metrics):
            summary = res[metric]
            label = f"{res['workload']} {res['describe']}" if n == 0 else ""
            cells = [f"{label:<28} {(metric + ' ' + unit) if metric != 'instructions' else unit:<12}"]
            for side in SIDES:
                if side not in summary["median"]:
                    continue
                cells.append(f"{summary['median'][side]:>{width}.{digits}f}")
                if side != "hand":
                    cells[-1] += f" {summary[side]['ratio']:>6.3f} {summary[side]['overhead']:>{width}.{digits}f}"
            print("  ".join(cells))
    print(f"medians over {results[0]['rounds']} interleaved round(s); overhead = trainer - hand."
          + (" cpu = CPU time of this process, wall = elapsed." if unit == "µs/step" else ""))
    if unit == "µs/step" and results[0]["rounds"] > 1:
        # On a loaded machine the medians of the two sides can drift apart; the fastest round of
        # each side and the median of the per-round (paired) ratios are steadier views of the same runs.
        for res in results:
            cpu = res["cpu"]
            print(f"  {res['workload']} cpu, fastest rounds: ratio {cpu['min']['trainer'] / cpu['min']['hand']:.3f}, "
                  f"overhead {cpu['min']['trainer'] - cpu['min']['hand']:.1f} µs/step; paired rounds: median ratio "
                  f"{cpu['trainer']['median_paired_ratio']:.3f}, overhead "
                  f"{cpu['trainer']['median_paired_overhead']:.1f} µs/step")


def main(fw: Framework, doc: str, argv: list[str] | None = None) -> int:
    """The command line every ``overhead_<framework>.py`` shares."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="batches per run (default 2000)")
    parser.add_argument("--rounds", type=int, default=9, help="measured rounds per side (default 9)")
    parser.add_argument("--workload", choices=[*fw.workloads, "all"], default="all")
    parser.add_argument("--no-progress", action="store_true", help="skip the progress_bar='raw' runs")
    parser.add_argument("--records", action="store_true", help="also time a run recording every step with the "
                        "csv and tensorboard loggers (needs tensorboardX)")
    parser.add_argument("--records-every", type=int, default=1, metavar="N",
                        help="with --records: log_every_n_steps (default 1, every step)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH ('-' = stdout)")
    parser.add_argument("--callgrind", metavar="OUT", help="count instructions instead of timing; run as "
                        "valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=OUT python "
                        "bench/overhead.py --callgrind OUT --rounds 1 ...")
    args = parser.parse_args(argv)
    if args.steps < 50 or args.rounds < 1:
        parser.error("--steps must be >= 50 and --rounds >= 1")
    meter: Meter = CallgrindMeter(args.callgrind) if args.callgrind else TimeMeter()
    RECORD_EVERY[0] = args.records_every
    names = list(fw.workloads) if args.workload == "all" else [args.workload]
    print(f"{fw.name} {fw.version}, python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"{fw.setup_line}{args.steps} steps x {args.rounds} rounds")
    results = [run_workload(fw, name, args.steps, args.rounds, not args.no_progress, meter, args.records)
               for name in names]
    print_table(results, meter)
    if args.json:
        payload = {fw.name: fw.version, "python": platform.python_version(), "cpus": os.cpu_count(),
                   "machine": platform.machine(), "results": results}
        text = json.dumps(payload, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
    return 0
