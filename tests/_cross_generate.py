"""Write the committed model folder of one framework for the cross-framework tests.

    python -m tests._cross_generate torch     # in the env that has that framework (see COMMON test commands)

Trains :func:`tests._cross_models` 's network through drivetrain in that framework (seed 0), writes it with
``trainer.save_model`` to ``tests/data/cross_framework/<framework>/model`` and, beside it, ``probe.npz`` with the
probe input and the logits the trained model gives on it. Every other framework's tests load the folder and must
give the same logits.
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np

from tests._cross_models import BUILDERS, DATA, logits, probe_input, train


def generate(framework: str) -> str:
    import drivetrain

    drivetrain.seed_everything(0)
    model = BUILDERS[framework]()
    trainer = train(framework, model)
    out = os.path.join(DATA, framework)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    trainer.save_model(os.path.join(out, "model"))
    x = probe_input()
    np.savez(os.path.join(out, "probe.npz"), x=x, logits=logits(framework, model, x))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in BUILDERS:
        raise SystemExit(f"usage: python -m tests._cross_generate {{{','.join(BUILDERS)}}}")
    print("wrote", generate(sys.argv[1]))
