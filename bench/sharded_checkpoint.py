"""Save and load times (and memory) of FSDP2 / ZeRO-3 checkpoints: sharded (every rank writes its pieces) against
gathered to rank 0.

A ~50M-parameter residual MLP (the model of ``bench/memory.py``: 6 blocks of Linear(1024,
4096) - GELU - Linear(4096, 1024) with LayerNorm), ``driver="torch_fsdp"``, Adam after one
step (weights + two moments: ~600 MB of state), CPU and gloo, started by
``torch.distributed.run`` at 2 ranks (``--ranks``). Per round, in alternating order:

- ``save sharded``: ``trainer.save_checkpoint`` with ``state_dict='sharded'`` (the default);
- ``save full``: the same with ``state_dict='full'`` (gathered into rank 0's memory, one file);
- ``load sharded`` / ``load full``: ``trainer.load_checkpoint(..., resume_training=False)`` of each;
- ``load sharded at 1``: one process (``driver="torch"``) loading the sharded checkpoint (rank 0's
  process after the run, timed separately).

``--driver deepspeed`` runs the same with ``driver="deepspeed"`` at ZeRO-3 (no parameter kept whole:
``stage3_param_persistence_threshold`` 0; ``--zero-stage 2`` for ZeRO-2), ``deepspeed_kwargs["state_dict"]``
sharded or full.

Times are wall seconds on rank 0 between barriers (every rank has finished), medians over the
rounds; ``peak MiB`` is the most any rank's resident memory rose above its level before the
operation (its high-water mark reset through ``/proc/self/clear_refs``), the largest over the rounds;
file sizes from the manifests. A measurement, not a test; on a shared 2-core machine the two
ranks also share the disk and the CPU that hashes.

    python bench/sharded_checkpoint.py [--driver torch_fsdp|deepspeed] [--rounds 3] [--ranks 2] [--dir FOLDER]
                                       [--json PATH]
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

WIDTH, HIDDEN, BLOCKS, BATCH = 1024, 4096, 6, 8


def build_model():
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(WIDTH)
            self.up, self.down = torch.nn.Linear(WIDTH, HIDDEN), torch.nn.Linear(HIDDEN, WIDTH)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block() for _ in range(BLOCKS)])

        def forward(self, x, y):  # a TensorDataset batch is (x, y)
            for block in self.blocks:
                x = block(x)
            return {"loss": torch.nn.functional.mse_loss(x, y)}

    return Net()


def trainer_for(model, driver: str, **options):
    import torch

    from drivetrain import Trainer

    dataset = torch.utils.data.TensorDataset(torch.randn(4 * BATCH, WIDTH), torch.randn(4 * BATCH, WIDTH))
    data = torch.utils.data.DataLoader(dataset, batch_size=BATCH)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    return Trainer(model, data, optimizer, driver=driver, n_batches=1, progress_bar=None, **options)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def timed(driver, fn, *args, **kwargs) -> tuple[float, float]:
    """(wall seconds, MiB the resident memory of the most-grown rank rose during ``fn``)."""
    driver.barrier()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    before = _status_kib("VmRSS")
    start = time.perf_counter()
    fn(*args, **kwargs)
    driver.barrier()
    seconds = time.perf_counter() - start
    grown = (_status_kib("VmHWM") - before) / 1024
    return seconds, max(driver.all_gather_object(grown))


def options_for(driver: str, mode: str, zero_stage: int) -> dict:
    if driver == "deepspeed":
        zero = {"stage": zero_stage, **({"stage3_param_persistence_threshold": 0} if zero_stage == 3 else {})}
        return {"deepspeed_kwargs": {"state_dict": mode, "config": {"zero_optimization": zero}}}
    return {"torch_fsdp_kwargs": {"state_dict": mode}}


def rank_main(folder: str, rounds: int, out: str, driver_name: str, zero_stage: int) -> None:
    import torch

    torch.manual_seed(0)
    trainers = {mode: trainer_for(build_model(), driver_name, **options_for(driver_name, mode, zero_stage))
                for mode in ("sharded", "full")}
    for trainer in trainers.values():
        trainer.run()  # one step: Adam's moments exist
    driver = trainers["sharded"].driver
    times: dict[str, list[float]] = {}
    peaks: dict[str, float] = {}

    def record(name: str, measured: tuple[float, float]) -> None:
        times.setdefault(name, []).append(measured[0])
        peaks[name] = max(peaks.get(name, 0.0), measured[1])

    for r in range(rounds):
        order = ("sharded", "full") if r % 2 == 0 else ("full", "sharded")
        for mode in order:
            record(f"save {mode}", timed(driver, trainers[mode].save_checkpoint, os.path.join(folder, mode)))
        for mode in order:
            record(f"load {mode}", timed(driver, trainers[mode].load_checkpoint, os.path.join(folder, mode),
                                         resume_training=False))
    if driver.rank == 0:
        sizes = {}
        for mode in ("sharded", "full"):
            manifest = json.load(open(os.path.join(folder, mode, "manifest.json")))
            sizes[mode] = {name: record["size"] for name, record in manifest["files"].items()}
        with open(out, "w") as f:
            json.dump({"times": times, "peaks": peaks, "sizes": sizes, "world_size": driver.world_size,
                       "driver": driver_name}, f)


def one_process_load(folder: str, rounds: int) -> list[float]:
    import torch

    torch.manual_seed(0)
    trainer = trainer_for(build_model(), "torch")
    result = []
    for _ in range(rounds):
        start = time.perf_counter()
        trainer.load_checkpoint(os.path.join(folder, "sharded"), resume_training=False)
        result.append(time.perf_counter() - start)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--driver", choices=("torch_fsdp", "deepspeed"), default="torch_fsdp")
    parser.add_argument("--zero-stage", type=int, choices=(1, 2, 3), default=3, help="with --driver deepspeed")
    parser.add_argument("--dir", help="where to write the checkpoints (default: a temporary folder)")
    parser.add_argument("--json")
    parser.add_argument("--rank-main", nargs=2, metavar=("FOLDER", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args.rank_main[0], args.rounds, args.rank_main[1], args.driver, args.zero_stage)
        return
    folder = tempfile.mkdtemp(prefix="sharded-bench-", dir=args.dir)
    out = os.path.join(folder, "result.json")
    try:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks),
               "--master_port", "29731", os.path.abspath(__file__), "--rounds", str(args.rounds), "--driver", args.driver,
               "--zero-stage", str(args.zero_stage),
               "--rank-main", folder, out]
        subprocess.run(cmd, check=True, timeout=1800)
        result = json.load(open(out))
        result["times"]["load sharded at 1 process"] = one_process_load(folder, args.rounds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    engine = f"{args.driver} (ZeRO-{args.zero_stage})" if args.driver == "deepspeed" else args.driver
    print(f"{engine}, {args.ranks} ranks, ~{BLOCKS * 2 * WIDTH * HIDDEN / 1e6:.0f}M parameters, Adam after one "
          f"step; load average {os.getloadavg()[0]:.1f}")
    for mode, files in result["sizes"].items():
        print(f"  {mode:8s} {len(files)} files, {sum(files.values()) / 2**20:,.0f} MiB")
    for name, values in result["times"].items():
        peak = result["peaks"].get(name)
        peak_text = f"   peak +{peak:,.0f} MiB/rank" if peak is not None else ""
        print(f"  {name:28s} median {statistics.median(values):6.2f} s   ({', '.join(f'{v:.2f}' for v in values)})"
              f"{peak_text}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
