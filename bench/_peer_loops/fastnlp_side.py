"""One round of fastNLP's side of bench/peers.py, run in fastNLP's own venv (``python fastnlp_side.py``).

fastNLP pins versions drivetrain conflicts with, so this script runs without drivetrain: it
takes overhead.py's model classes (standing in for the harness module overhead.py imports,
which needs drivetrain), and the initial weights and batches from the file bench/peers.py
wrote. It warms up, checks that fastNLP's run ends with the same weights as the hand loop,
times a hand loop and fastNLP's ``Trainer.run()`` in the order given, and prints one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import logging
import os
import sys
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("FASTNLP_GLOBAL_SEED", "0")

import torch  # noqa: E402 - after the thread settings

Batches = list[dict[str, torch.Tensor]]


def overhead_module() -> types.ModuleType:
    """bench/overhead.py, its harness import (drivetrain) stood in for: only its models are used."""
    stub = types.ModuleType("_overhead_harness")
    stub.SEED, stub.main = 0, None
    stub.Framework = stub.Workload = lambda *args, **kwargs: None
    sys.modules.setdefault("_overhead_harness", stub)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import overhead

    return overhead


def fresh(initial_state: dict, cls: type[torch.nn.Module]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = cls()
    model.load_state_dict(initial_state)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def hand(model: torch.nn.Module, opt: torch.optim.Optimizer, batches: Batches) -> Callable[[], None]:
    ov = overhead_module()

    def loop() -> None:
        ov.prepare_hand(model, opt)
        for batch in batches:
            ov.hand_step(model, opt, batch)
    return loop


def fastnlp(model: torch.nn.Module, opt: torch.optim.Optimizer, batches: Batches) -> Callable[[], None]:
    from fastNLP import Trainer

    # fastNLP takes a torch DataLoader only: one over the pre-built batches, no re-batching (batch_size=None)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)
    trainer = Trainer(model, train_dataloader=loader, optimizers=opt, driver="torch", device="cpu",
                      n_epochs=1, progress_bar=None)
    return lambda: trainer.run(num_eval_sanity_batch=0)


def timed(build: Callable, initial_state: dict, cls: type, batches: Batches) -> tuple[dict, torch.nn.Module]:
    model, opt = fresh(initial_state, cls)
    with contextlib.redirect_stdout(io.StringIO()):
        loop = build(model, opt, batches)
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        loop()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"cpu": cpu / len(batches) * 1e6, "wall": wall / len(batches) * 1e6}, model


def compare(a: torch.nn.Module, b: torch.nn.Module) -> str:
    pairs = list(zip(a.parameters(), b.parameters(), strict=True))
    if all(torch.equal(x, y) for x, y in pairs):
        return "identical"
    diff = max((x - y).abs().max().item() for x, y in pairs)
    close = all(torch.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in pairs)
    return f"{'close' if close else 'differ'} (max |diff| {diff:.1e})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", action="store_true", help="print fastNLP's version if it imports, and exit")
    parser.add_argument("--workload", choices=["W1", "W2"])
    parser.add_argument("--data", help="the torch file bench/peers.py wrote (initial weights, batches)")
    parser.add_argument("--order", default="hand,fastnlp")
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import fastNLP
    if args.probe:
        print(fastNLP.__version__)
        return 0
    ov = overhead_module()
    cls = {"W1": ov.MLP, "W2": ov.Regression}[args.workload]
    data = torch.load(args.data, weights_only=True)
    state, batches = data["state"], data["batches"]
    builders = {"hand": hand, "fastnlp": fastnlp}
    _, hand_model = timed(hand, state, cls, batches[:args.warmup])
    _, fnlp_model = timed(fastnlp, state, cls, batches[:args.warmup])
    out: dict = {"weights": compare(hand_model, fnlp_model)}
    for side in args.order.split(","):
        out[side], _ = timed(builders[side], state, cls, batches)
    torch.set_num_threads(1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
