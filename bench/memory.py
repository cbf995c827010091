"""Peak resident memory per rank: DDP (``driver="torch"``) against FSDP2 (``driver="torch_fsdp"``) and DeepSpeed
ZeRO-3 (``driver="deepspeed"``, side ``zero3``; skipped when deepspeed is not installed).

ZeRO-3 runs with :data:`LEAN_ZERO3` (nothing gathered is kept, small reduce buckets): with DeepSpeed's
defaults every gathered block stays live and a 50M model keeps all of its weights gathered.

A ~50M-parameter residual MLP (6 blocks of Linear(1024, 4096) - GELU - Linear(4096, 1024)
with LayerNorm; a ModuleList, so FSDP shards each block) trained with Adam for a few steps,
CPU and gloo, at 2 and 4 ranks, each started by ``torch.distributed.run``. A third side,
``hand-fsdp``, is a hand-written FSDP2 loop (``fully_shard`` per block and at the root,
forward, backward, ``step()``, ``zero_grad()``) on the same model, for the step-time ratio.
Two more sides, run when named in ``--sides``: ``fsdp-meta`` builds the model on the meta
device (each rank allocates only its shards), ``fsdp-linear`` also makes every Linear its own
FSDP unit (``torch_fsdp_kwargs={"wrap": ["Linear"]}``: half-size gather and reduce buffers).

Each rank measures its resident memory (``VmRSS``) after the imports, before the model is
built: the baseline. The peak (``VmHWM``) minus that baseline is reported twice:

- ``peak``: over the whole run, model construction included (the driver builds the full
  model in every process and then shards it, so FSDP's peak holds one full copy at least);
- ``train``: over the training steps after the first one (the high-water mark is reset
  through ``/proc/self/clear_refs`` once the first step has allocated Adam's state).

Every configuration runs with glibc's default allocator and with
``MALLOC_MMAP_THRESHOLD_=1048576`` (buffers of 1 MiB and more are mmapped, so freed ones
go back to the system at once instead of staying in the heap). Step time: the median of
steps 2..N on rank 0 (the slowest rank waits for the others anyway).

    python bench/memory.py [--steps 6] [--ranks 2 4] [--json PATH]

Memory: 4 ranks of DDP hold ~1.3 GB each. A measurement, not a test; the step times on a
shared 2-core machine move with its load (reported).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

WIDTH, HIDDEN, BLOCKS, BATCH = 1024, 4096, 6, 8
SIDES = ("ddp", "fsdp", "hand-fsdp", "zero3", "fsdp-meta", "fsdp-linear")
DEFAULT_SIDES = SIDES[:4]
DRIVERS = {"ddp": "torch", "fsdp": "torch_fsdp", "zero3": "deepspeed", "fsdp-meta": "torch_fsdp",
           "fsdp-linear": "torch_fsdp"}
LEAN_ZERO3 = {"stage": 3, "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0,
              "stage3_prefetch_bucket_size": 0, "reduce_bucket_size": 5 * 10**6}
"""ZeRO-3 keeping no gathered parameter around (DeepSpeed's defaults keep up to 1e9 live, i.e. all of this model)."""
MMAP_THRESHOLD = "1048576"


# ---------------------------------------------------------------------------------------- memory
def _status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> bool:
    """Reset the peak resident size (VmHWM) to the current one; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


# ---------------------------------------------------------------------------------------- worker
def worker(side: str, steps: int, out: str) -> None:
    """One rank: baseline, build, train ``steps`` steps, write ``out-rank<r>.json``."""
    import torch
    import torch.distributed as dist

    from drivetrain import Callback, Trainer

    torch.set_num_threads(1)
    if side == "zero3":
        import deepspeed  # noqa: F401  (imported before the baseline, as torch is: its import is not training)
    baseline = _status_kib("VmRSS")
    resettable = reset_peak()
    rank = int(os.environ["RANK"])

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(WIDTH)
            self.up = torch.nn.Linear(WIDTH, HIDDEN)
            self.down = torch.nn.Linear(HIDDEN, WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block() for _ in range(BLOCKS)])

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict:
            for block in self.blocks:
                x = block(x)
            return {"loss": torch.nn.functional.mse_loss(x, y)}

    times: list[float] = []
    marks: dict[str, int] = {}

    def after_step(step: int) -> None:
        times.append(time.perf_counter())
        if step == 1:
            marks["after_first"] = _status_kib("VmHWM")
            reset_peak()

    torch.manual_seed(0)
    if side in ("fsdp-meta", "fsdp-linear"):  # built on the meta device: each rank allocates only its shards
        with torch.device("meta"):
            model = Net()
    else:
        model = Net()
    n_params = sum(p.numel() for p in model.parameters())
    world = int(os.environ["WORLD_SIZE"])
    gen = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(BATCH * world * steps, WIDTH, generator=gen),
                                          torch.randn(BATCH * world * steps, WIDTH, generator=gen))
    if side == "hand-fsdp":
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        xs, ys = data.tensors
        for step in range(1, steps + 1):
            i = (step - 1) * BATCH * world + rank * BATCH
            model(xs[i:i + BATCH], ys[i:i + BATCH])["loss"].backward()
            optimizer.step()
            optimizer.zero_grad()
            after_step(step)
    else:
        class Steps(Callback):
            def on_train_batch_end(self, trainer) -> None:
                after_step(trainer.global_forward_batches)

        loader = torch.utils.data.DataLoader(data, batch_size=BATCH,
                                             collate_fn=lambda items: {"x": torch.stack([i[0] for i in items]),
                                                                       "y": torch.stack([i[1] for i in items])})
        options = {"deepspeed_kwargs": {"config": {"zero_optimization": LEAN_ZERO3}}} if side == "zero3" else {}
        if side == "fsdp-linear":  # every Linear its own FSDP unit: gather/reduce buffers of 4.2M, not 8.4M
            options = {"torch_fsdp_kwargs": {"wrap": ["Linear"]}}
        trainer = Trainer(model, loader, torch.optim.Adam(model.parameters(), lr=1e-4), driver=DRIVERS[side],
                          n_epochs=1, n_batches=steps, callbacks=[Steps()], progress_bar=None, **options)
        trainer.run(num_eval_sanity_batch=0)
    end = _status_kib("VmHWM")
    result = {"rank": rank, "world": world, "side": side, "params": n_params, "baseline_kib": baseline,
              "peak_kib": max(end, marks.get("after_first", 0)) - baseline,
              "train_kib": end - baseline if resettable else None,
              "step_s": statistics.median(b - a for a, b in zip(times[1:], times[2:], strict=False))
              if len(times) > 2 else None,
              "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_")}
    with open(f"{out}-rank{rank}.json", "w") as f:
        json.dump(result, f)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------- driver
def launch(side: str, ranks: int, steps: int, tuned: bool, folder: str, port: int) -> list[dict]:
    """Start one configuration under torchrun and read each rank's result."""
    out = os.path.join(folder, f"{side}-{ranks}-{'tuned' if tuned else 'default'}")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if tuned:
        env["MALLOC_MMAP_THRESHOLD_"] = MMAP_THRESHOLD
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port",
           str(port), __file__, "--worker", side, "--steps", str(steps), "--out", out]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode:
        raise RuntimeError(f"{side} at {ranks} ranks failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return [json.load(open(f"{out}-rank{r}.json")) for r in range(ranks)]  # noqa: SIM115


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mib(kib: float | None) -> str:
    return "-" if kib is None else f"{kib / 1024:,.0f}"


def report(results: dict[tuple[str, int, bool], list[dict]], ranks: list[int]) -> str:
    """A markdown table: per-rank MiB above baseline (max over ranks), ratios to DDP, step times."""
    lines = ["| ranks | allocator | side | peak MiB/rank | train MiB/rank | peak / DDP | train / DDP | step s | "
             "step / DDP | step / hand-fsdp |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for n in ranks:
        for tuned in (False, True):
            row = {side: results[(side, n, tuned)] for side in SIDES if (side, n, tuned) in results}

            def worst(side: str, key: str, row: dict = row) -> float | None:
                values = [r[key] for r in row[side] if r[key] is not None]
                return max(values) if values else None

            ddp = {k: worst("ddp", k) for k in ("peak_kib", "train_kib")}
            ddp_step = row["ddp"][0]["step_s"]
            hand_step = row["hand-fsdp"][0]["step_s"] if "hand-fsdp" in row else None
            for side in row:
                peak, train, step = worst(side, "peak_kib"), worst(side, "train_kib"), row[side][0]["step_s"]
                ratio = [f"{a / b:.2f}" if a and b else "-" for a, b in
                         ((peak, ddp["peak_kib"]), (train, ddp["train_kib"]), (step, ddp_step), (step, hand_step))]
                alloc = f"MMAP_THRESHOLD={MMAP_THRESHOLD}" if tuned else "glibc default"
                lines.append(f"| {n} | {alloc} | {side} | {_mib(peak)} | {_mib(train)} | {ratio[0]} | {ratio[1]} | "
                             f"{step:.3f} | {ratio[2]} | {ratio[3]} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sides", nargs="+", default=list(DEFAULT_SIDES), choices=SIDES)
    parser.add_argument("--json")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.out)
        return
    if "zero3" in args.sides and importlib.util.find_spec("deepspeed") is None:
        print("deepspeed is not installed: side zero3 skipped (pip install -e backends/torch -e backends/deepspeed)",
              file=sys.stderr)
        args.sides.remove("zero3")
    started, load = time.monotonic(), os.getloadavg()
    results: dict[tuple[str, int, bool], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="drivetrain-memory-") as folder:
        for n in args.ranks:
            for tuned in (False, True):
                for side in args.sides:
                    t0 = time.monotonic()
                    results[(side, n, tuned)] = launch(side, n, args.steps, tuned, folder, _free_port())
                    print(f"{side:9} ranks={n} tuned={tuned}: {time.monotonic() - t0:.0f} s", file=sys.stderr,
                          flush=True)
    params = next(iter(results.values()))[0]["params"]
    print(f"model: {params / 1e6:.1f}M parameters, Adam, batch {BATCH} per rank, {args.steps} steps; "
          f"load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}; {time.monotonic() - started:.0f} s")
    print(report(results, args.ranks))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"side": s, "ranks": n, "tuned": t, "per_rank": r} for (s, n, t), r in results.items()], f)


if __name__ == "__main__":
    main()
