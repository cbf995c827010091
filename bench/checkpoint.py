"""What do checkpoints cost? Save time against a bare safetensors write, and resume time against k.

(a) save: ``trainer.save_checkpoint(folder)`` against the least a careful user would
    do by hand: ``safetensors.<framework>.save_file`` of the same tensors (model and
    optimizer state) in one file, then ``fsync``. Models of ~10M and ~50M parameters;
    on torch with Adam after one step (so its two moments are in the state), on the
    numpy test driver a linear layer with SGD (no optimizer tensors). Sides alternate
    (bare, trainer, bare, ...), each writes a fresh folder, the median of the rounds
    is reported and the ratio trainer / bare (target <= 1.15). Two more columns, timed
    in the same rounds on the same tensors: ``stream s``, the core's writer alone
    (``safetensors_writer.write_file``: each tensor's memory streamed into one file,
    sha256 on a second thread, fsync), and ``sha256 s``, hashing those bytes alone, a
    floor for any save that records a checksum. The checkpoint does more than the bare
    write: it also records RNG states, the loop position and the sampler, hashes every
    file, writes a manifest and fsyncs the folder and its parent.

(b) resume: seconds from building the ``Trainer`` and calling ``run(resume_from=...)``
    to the first training batch (``on_train_batch_begin``), for checkpoints taken k
    batches into an epoch of 200,000 samples with batch size 1, k = 10 and 100,000.
    The reproducible sampler starts at the saved offset of the epoch's permutation, so
    this must not grow with k (a loader without it would read and drop k batches).

    python bench/checkpoint.py [--part save|resume|all] [--driver numpy|torch|all]
                               [--rounds N] [--sizes 10,50] [--dir FOLDER] [--json PATH]

This is a measurement, not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from drivetrain import Event, Trainer, seed_everything  # noqa: E402
from drivetrain._format import safetensors_writer  # noqa: E402

DATASET = 200_000
RESUME_STEPS = (10, 100_000)


class Stop(Exception):
    """Raised from on_train_batch_begin to end a resumed run at its first batch."""


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def folder_bytes(folder: str) -> int:
    return sum(e.stat().st_size for e in os.scandir(folder) if e.is_file())


# ----------------------------------------------------------------------- models per driver
def torch_setup(millions: int) -> tuple[Trainer, Callable[[], dict[str, Any]], Callable[[dict, str], None]]:
    """A stack of 1024x1024 Linear layers (~1.05M parameters each) trained one Adam step."""
    import safetensors.torch
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = max(1, round(millions * 1e6 / (1024 * 1024 + 1024)))
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(4, 1024)).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    loader = [{"x": torch.randn(4, 1024)}]
    trainer = Trainer(model, loader, opt, driver="torch", device="cpu", progress_bar=None,
                      batch_step_fn=lambda t, b: None)

    def tensors() -> dict[str, Any]:
        out = {f"model/{k}": v.detach() for k, v in model.state_dict().items()}
        for i, state in opt.state_dict()["state"].items():
            for name, value in state.items():
                out[f"optimizer/{i}/{name}"] = value
        return out

    def save(tensors: dict, path: str) -> None:
        safetensors.torch.save_file(tensors, path)
        fsync_file(path)

    return trainer, tensors, save


def numpy_setup(millions: int) -> tuple[Trainer, Callable[[], dict[str, Any]], Callable[[dict, str], None]]:
    """A square LinearModel (numpy test driver) with SGD, which keeps no tensors."""
    import safetensors.numpy

    from drivetrain_numpy import SGD, ArrayLoader, LinearModel

    side = int((millions * 1e6) ** 0.5)
    model = LinearModel(side, side, seed=0)
    loader = ArrayLoader({"x": np.zeros((1, side), np.float32), "target": np.zeros((1, side), np.float32)})
    trainer = Trainer(model, loader, SGD(model.params, model.grads), driver="numpy", progress_bar=None)

    def tensors() -> dict[str, Any]:
        return {f"model/{k}": v for k, v in model.params.items()}

    def save(tensors: dict, path: str) -> None:
        safetensors.numpy.save_file(tensors, path)
        fsync_file(path)

    return trainer, tensors, save


SETUPS = {"torch": torch_setup, "numpy": numpy_setup}


def bench_save(driver: str, millions: int, rounds: int, workdir: str) -> dict[str, Any]:
    trainer, tensors, bare_save = SETUPS[driver](millions)
    n_params = sum(int(np.prod(v.shape)) for k, v in tensors().items() if k.startswith("model/"))
    bare, full, stream, sha = [], [], [], []
    size_bare = size_full = 0
    for r in range(rounds + 1):  # round 0 warms up (page cache, allocator) and is not counted
        path = os.path.join(workdir, f"bare-{r}.safetensors")
        gc.collect()
        start = time.perf_counter()
        bare_save(tensors(), path)
        elapsed_bare = time.perf_counter() - start
        size_bare = os.path.getsize(path)
        os.remove(path)

        folder = os.path.join(workdir, f"ckpt-{r}")
        gc.collect()
        start = time.perf_counter()
        trainer.save_checkpoint(folder)
        elapsed_full = time.perf_counter() - start
        size_full = folder_bytes(folder)
        shutil.rmtree(folder)

        path = os.path.join(workdir, f"stream-{r}.safetensors")
        gc.collect()
        start = time.perf_counter()
        entries = trainer.driver.tensor_file(tensors())
        safetensors_writer.write_file(path, entries)
        elapsed_stream = time.perf_counter() - start
        os.remove(path)

        head, views = safetensors_writer.layout(entries)
        start = time.perf_counter()
        digest = hashlib.sha256(head)
        for view in views:
            digest.update(view)
        elapsed_sha = time.perf_counter() - start
        del entries, views
        if r:
            bare.append(elapsed_bare)
            full.append(elapsed_full)
            stream.append(elapsed_stream)
            sha.append(elapsed_sha)
    b, f = statistics.median(bare), statistics.median(full)
    return {"driver": driver, "params_M": n_params / 1e6, "bare_s": b, "checkpoint_s": f, "ratio": f / b,
            "stream_s": statistics.median(stream), "sha256_s": statistics.median(sha),
            "bare_MB": size_bare / 1e6, "checkpoint_MB": size_full / 1e6, "rounds": rounds,
            "bare_all": bare, "checkpoint_all": full}


# ------------------------------------------------------------------------------ resume
def resume_loader(driver: str):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((DATASET, 4)).astype(np.float32)
    target = rng.standard_normal((DATASET, 1)).astype(np.float32)
    if driver == "numpy":
        from drivetrain_numpy import SGD, ArrayLoader, LinearModel

        def make() -> Trainer:
            model = LinearModel(4, 1, seed=0)
            loader = ArrayLoader({"x": x, "target": target}, batch_size=1, shuffle=True, seed=3)
            return Trainer(model, loader, SGD(model.params, model.grads), driver="numpy", n_epochs=1,
                           progress_bar=None, batch_step_fn=lambda t, b: None)
    else:
        import torch

        torch.set_num_threads(1)
        dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(target))

        def make() -> Trainer:
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 1)
            loader = torch.utils.data.DataLoader(dataset, batch_size=1, shuffle=True)
            return Trainer(model, loader, torch.optim.Adam(model.parameters()), driver="torch", device="cpu",
                           n_epochs=1, progress_bar=None, batch_step_fn=lambda t, b: None)
    return make


def bench_resume(driver: str, rounds: int, workdir: str) -> list[dict[str, Any]]:
    make = resume_loader(driver)
    folders = {}
    seed_everything(0)
    trainer = make()
    last = max(RESUME_STEPS)

    def save_at(t):
        if t.global_forward_batches in RESUME_STEPS:
            folders[t.global_forward_batches] = t.save_checkpoint(
                os.path.join(workdir, f"resume-{driver}-{t.global_forward_batches}"))
            if t.global_forward_batches == last:
                raise Stop()

    trainer.add_callback_fn(Event.on_train_batch_end(), save_at)
    start = time.perf_counter()
    try:
        trainer.run(num_eval_sanity_batch=0)
    except Exception as exc:  # CallbackError wrapping Stop
        if "Stop" not in repr(exc) and not isinstance(exc.__cause__, Stop):
            raise
    making = time.perf_counter() - start
    rows = []
    for k in RESUME_STEPS:
        times = []
        for r in range(rounds + 1):
            seen: list[float] = []

            def first_batch(t, batch, indices, seen=seen):
                seen.append(time.perf_counter())
                raise Stop()

            gc.collect()
            start = time.perf_counter()
            resumed = make()
            resumed.add_callback_fn(Event.on_train_batch_begin(), first_batch)
            try:
                resumed.run(resume_from=folders[k], num_eval_sanity_batch=0)
            except Exception as exc:
                if not seen:
                    raise
                del exc
            if resumed.global_forward_batches != k:
                raise SystemExit(f"resumed at {resumed.global_forward_batches}, expected {k}")
            if r:
                times.append(seen[0] - start)
        rows.append({"driver": driver, "k": k, "median_s": statistics.median(times), "min_s": min(times),
                     "max_s": max(times), "rounds": rounds})
    print(f"  ({driver}: reaching k={last} with a no-op batch step took {making:.1f} s)")
    return rows


# ------------------------------------------------------------------------------- main
def torch_driver_ready() -> str | None:
    """Why the torch part cannot run, or None."""
    try:
        import inspect

        from drivetrain_torch.driver import TorchSingleDriver
    except ImportError as exc:
        return f"the torch backend is not installed ({exc})"
    if inspect.isabstract(TorchSingleDriver):
        return "the torch driver does not implement the checkpoint state methods yet"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("save", "resume", "all"), default="all")
    parser.add_argument("--driver", choices=("numpy", "torch", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="10,50", help="model sizes in millions of parameters")
    parser.add_argument("--dir", help="where to write (default: a temp folder on the default temp disk)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    drivers = ["numpy", "torch"] if args.driver == "all" else [args.driver]
    if "torch" in drivers and (why := torch_driver_ready()) is not None:
        print(f"skipping torch: {why}")
        drivers.remove("torch")
    workdir = tempfile.mkdtemp(prefix="drivetrain-ckpt-bench-", dir=args.dir)
    print(f"python {platform.python_version()} on {platform.platform()}, {os.cpu_count()} CPUs, writing to {workdir}")
    if "torch" in drivers:
        import torch

        print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    results: dict[str, Any] = {"save": [], "resume": []}
    try:
        if args.part in ("save", "all"):
            print(f"\n(a) save time, median of {args.rounds} rounds "
                  "(bare = safetensors save_file + fsync of model + optimizer tensors)")
            print(f"{'driver':<7}{'params':>9}{'bare MB':>9}{'ckpt MB':>9}{'bare s':>9}{'ckpt s':>9}{'ratio':>7}"
                  f"{'stream s':>10}{'sha256 s':>10}")
            for driver in drivers:
                for millions in (int(s) for s in args.sizes.split(",")):
                    row = bench_save(driver, millions, args.rounds, workdir)
                    results["save"].append(row)
                    print(f"{driver:<7}{row['params_M']:>8.1f}M{row['bare_MB']:>9.1f}{row['checkpoint_MB']:>9.1f}"
                          f"{row['bare_s']:>9.3f}{row['checkpoint_s']:>9.3f}{row['ratio']:>6.2f}x"
                          f"{row['stream_s']:>10.3f}{row['sha256_s']:>10.3f}")
                    gc.collect()
        if args.part in ("resume", "all"):
            print(f"\n(b) resume: Trainer(...) + run(resume_from=...) to the first batch, {DATASET:,} samples, "
                  f"batch size 1, median of {args.rounds} rounds")
            for driver in drivers:
                rows = bench_resume(driver, args.rounds, workdir)
                results["resume"].extend(rows)
                for row in rows:
                    print(f"  {driver:<7} k={row['k']:>7,}: {row['median_s'] * 1e3:8.1f} ms "
                          f"(min {row['min_s'] * 1e3:.1f}, max {row['max_s'] * 1e3:.1f})")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
