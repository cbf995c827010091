"""The loop's stall per checkpoint: ``CheckpointCallback(background=True)`` against the foreground save.

The ~50M-parameter residual MLP of ``bench/sharded_checkpoint.py`` (6 blocks of Linear(1024, 4096) - GELU -
Linear(4096, 1024) with LayerNorm) trained with Adam (weights + two moments: ~600 MB a checkpoint), saving every
``--every`` batches with ``keep_last_n=2``:

- ``one``: ``driver="torch"``, one process (``--device cpu``, or ``cuda`` where there is one);
- ``sharded``: ``driver="torch_fsdp"``, 2 ranks (torchrun, gloo on CPU), every rank writing its shard.

The stall is the wall time the loop spends inside the CheckpointCallback's handlers: the saves themselves
(foreground: gather, write, hash, fsync, rename; background: the copy to host memory, and the wait for the
previous write if it is not done yet) and, for background saves, the checks between saves and the commit
(distributed: collectives at a few step boundaries). ``stall per save`` is that total divided by the number of
saves; ``end wait`` (background only) is how long the end of the run waited for the last write, and ``run`` the
whole run's wall time (the worker's writing and hashing compete with training for the CPUs). Foreground and
background runs alternate, ``--rounds`` each; medians over the rounds. For the sharded save, per step the
slowest rank counts (the ranks meet at every step). A measurement, not a test.

    python bench/background_save.py [--setup one|sharded|both] [--rounds 2] [--saves 4] [--every 12]
                                    [--device cpu|cuda] [--dir FOLDER] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sharded_checkpoint import BATCH, WIDTH, build_model  # noqa: E402  (the same ~50M-parameter model)


def timed_callback(folder: str, every: int, background: bool):
    """A CheckpointCallback that adds up the time its handlers take (the loop's stall)."""
    from drivetrain import CheckpointCallback

    class Timed(CheckpointCallback):
        stall = 0.0
        saves: list[float] = []
        end_wait = 0.0

        def _timed(self, handler, trainer) -> float:
            start = time.perf_counter()
            before = self._last_periodic_step
            handler(trainer)
            spent = time.perf_counter() - start
            self.stall += spent
            if self._last_periodic_step != before:
                self.saves.append(spent)
            return spent

        def on_fetch_data_begin(self, trainer) -> None:
            self._timed(super().on_fetch_data_begin, trainer)

        def on_train_epoch_begin(self, trainer) -> None:
            self._timed(super().on_train_epoch_begin, trainer)

        def on_train_end(self, trainer) -> None:
            start = time.perf_counter()
            super().on_train_end(trainer)
            self.end_wait = time.perf_counter() - start

    callback = Timed(folder, every_n_batches=every, keep_last_n=2, save_last=False, background=background)
    callback.saves = []
    return callback


def one_run(folder: str, driver: str, device: str | None, saves: int, every: int, background: bool) -> dict:
    import torch

    from drivetrain import Trainer

    torch.manual_seed(0)
    model = build_model()
    dataset = torch.utils.data.TensorDataset(torch.randn(4 * BATCH, WIDTH), torch.randn(4 * BATCH, WIDTH))
    callback = timed_callback(folder, every, background)
    options = {"device": device} if device else {}
    trainer = Trainer(model, torch.utils.data.DataLoader(dataset, batch_size=BATCH),
                      torch.optim.Adam(model.parameters(), lr=1e-4), driver=driver, n_batches=saves * every + 1,
                      progress_bar=None, callbacks=[callback], **options)
    start = time.perf_counter()
    trainer.run()
    run = time.perf_counter() - start
    shutil.rmtree(folder, ignore_errors=True)
    d = trainer.driver
    result = {"stall": callback.stall, "saves": callback.saves, "end_wait": callback.end_wait, "run": run}
    if d.is_distributed():  # the ranks meet at every step: the slowest rank's stall is the loop's
        gathered = d.all_gather_object(result)
        result = {"stall": max(g["stall"] for g in gathered), "end_wait": max(g["end_wait"] for g in gathered),
                  "run": max(g["run"] for g in gathered),
                  "saves": [max(s) for s in zip(*(g["saves"] for g in gathered), strict=True)]}
    return result


def rounds_main(folder: str, driver: str, device: str | None, rounds: int, saves: int, every: int,
                out: str | None) -> dict:
    results: dict[str, list[dict]] = {"foreground": [], "background": []}
    for r in range(rounds):
        order = ("foreground", "background") if r % 2 == 0 else ("background", "foreground")
        for mode in order:
            results[mode].append(one_run(os.path.join(folder, f"{mode}-{r}"), driver, device, saves, every,
                                         mode == "background"))
    if out is not None and int(os.environ.get("RANK", "0")) == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    return results


def summary(name: str, results: dict[str, list[dict]], saves: int) -> dict:
    rows = {}
    for mode, runs in results.items():
        rows[mode] = {"stall per save": statistics.median(r["stall"] / saves for r in runs),
                      "save call": statistics.median(s for r in runs for s in r["saves"]),
                      "end wait": statistics.median(r["end_wait"] for r in runs),
                      "run": statistics.median(r["run"] for r in runs)}
    ratio = rows["background"]["stall per save"] / rows["foreground"]["stall per save"]
    print(f"{name}: {saves} saves per run; load average {os.getloadavg()[0]:.1f}")
    for mode, row in rows.items():
        print(f"  {mode:10s} stall per save {row['stall per save']:6.3f} s   (save call median {row['save call']:.3f} s)"
              f"   end wait {row['end wait']:5.2f} s   run {row['run']:6.1f} s")
    print(f"  background / foreground stall: {ratio:.3f} ({'meets' if ratio <= 0.10 else 'misses'} the 10% goal)")
    return {"rows": rows, "ratio": ratio, "runs": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", choices=("one", "sharded", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--every", type=int, default=12, help="batches between saves")
    parser.add_argument("--device", default=None, help="one process: cpu (default) or cuda")
    parser.add_argument("--dir", help="where to write the checkpoints (default: a temporary folder)")
    parser.add_argument("--json")
    parser.add_argument("--rank-main", nargs=2, metavar=("FOLDER", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rounds_main(args.rank_main[0], "torch_fsdp", None, args.rounds, args.saves, args.every, args.rank_main[1])
        return
    report = {}
    folder = tempfile.mkdtemp(prefix="background-bench-", dir=args.dir)
    try:
        if args.setup in ("one", "both"):
            results = rounds_main(folder, "torch", args.device, args.rounds, args.saves, args.every, None)
            report["one process"] = summary(f"one process ({args.device or 'cpu'})", results, args.saves)
        if args.setup in ("sharded", "both"):
            out = os.path.join(folder, "sharded.json")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29733",
                   os.path.abspath(__file__), "--rounds", str(args.rounds), "--saves", str(args.saves), "--every",
                   str(args.every), "--rank-main", folder, out]
            subprocess.run(cmd, check=True, timeout=3600)
            report["sharded, 2 ranks"] = summary("torch_fsdp, 2 ranks (gloo, CPU)", json.load(open(out)), args.saves)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
