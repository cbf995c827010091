"""kill -9 at random moments, then resume: the final parameters are bit-identical to an uninterrupted run.

Real processes (``_kill9_train.py`` on the numpy driver: shuffled data, noise drawn
from numpy's global RNG like dropout, gradient accumulation over 3 batches, a
checkpoint after every batch with a rotation keeping two) are started, SIGKILLed
after a random delay, and resumed from their checkpoint folder until they finish;
sometimes the resumed process is killed too. Saves are slowed down (a sleep before
each file) and each batch takes a few ms (a sleep standing in for compute) so that kills
land both inside saves and between them. After every kill each checkpoint
folder under its real name must verify. ``pytest -s`` shows the tally. The long
version is ``bench/kill9_stress.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from drivetrain._format.folder import read_checkpoint, resolve_resume_folder

from ._kill9 import CHECKPOINT_KWARGS_ENV, SCRIPT, Delays, kill_rounds

N_KILLS = 20


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_kill9_at_random_moments_then_resume_is_bit_exact(tmp_path):
    start = time.monotonic()
    # ~12 ms of sleep per save (4 files) and 12 ms per batch: about half the kills land inside a save.
    tally = kill_rounds(str(tmp_path), N_KILLS, seed=2024, driver="numpy", delays=Delays(save=0.003, step=0.012),
                        max_kills_per_round=4, timeout=60)
    print(f"\nkill -9 (numpy): {tally.summary()}; {time.monotonic() - start:.1f} s")
    assert tally.total_kills == N_KILLS
    assert tally.bit_exact_rounds == tally.rounds > 0
    # Both kinds of kill point are exercised: inside a save (a temp folder left behind) and between saves.
    assert tally.landed("save") >= 2, tally.kills
    assert tally.landed("training") + tally.landed("rotation") >= 2, tally.kills
    assert tally.resume_kills >= 2, tally.kills


# A checkpoint saved under a name that already exists replaces the old one with two renames
# (old -> .tmp-old-..., new temp -> name). A kill between them leaves both complete
# checkpoints under temp names only; the resume must still find one of them.
REPLACE_CHILD = r"""
import os, sys
import numpy as np
from drivetrain import Trainer
from drivetrain._format import folder
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

ckpt_dir, kill_after = sys.argv[1], sys.argv[2]
x = np.random.default_rng(0).standard_normal((20, 3)).astype(np.float32)
model = LinearModel(3, 1)
trainer = Trainer(model, ArrayLoader({"x": x, "target": x[:, :1]}, batch_size=4), SGD(model.params, model.grads),
                  driver="numpy", progress_bar=None)
trainer.save_checkpoint(os.path.join(ckpt_dir, "latest"))
real_rename = os.rename
renames = []

def rename_then_maybe_die(src, dst):
    real_rename(src, dst)
    renames.append(os.path.basename(dst))
    if (kill_after == "first-rename" and len(renames) == 1) or (kill_after == "second-rename" and len(renames) == 2):
        os.kill(os.getpid(), 9)

folder.os.rename = rename_then_maybe_die
trainer.save_checkpoint(os.path.join(ckpt_dir, "latest"))
"""


@pytest.mark.parametrize("kill_after", [
    "first-rename",
    "second-rename",
])
def test_kill9_while_replacing_a_checkpoint_keeps_one(tmp_path, kill_after):
    proc = subprocess.run([sys.executable, "-c", REPLACE_CHILD, str(tmp_path), kill_after], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    assert any(e.startswith(".tmp-") for e in os.listdir(tmp_path))
    found = resolve_resume_folder(tmp_path)  # raises CheckpointError when nothing is left
    read_checkpoint(found)


def test_the_child_passes_the_environments_checkpoint_kwargs_to_its_callback(tmp_path):
    """``bench/kill9_stress.py --checkpoint-kwargs`` reaches the child's CheckpointCallback (and wins over its own)."""
    env = dict(os.environ, **{CHECKPOINT_KWARGS_ENV: '{"every_n_batches": 5, "save_last": false}'})
    proc = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "ckpt"), str(tmp_path / "out.npz")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["step_00000040-epoch_2-batch_10",
                                                     "step_00000045-epoch_3-batch_0"]
