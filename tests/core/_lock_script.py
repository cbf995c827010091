"""A slow training run that holds its checkpoint folder (the folder-lock test starts it as a process).

    _lock_script.py FOLDER MARKER
"""

import sys
import time

from drivetrain import Callback, CheckpointCallback, Trainer
from drivetrain_numpy import SGD, ArrayLoader, LinearModel

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from conftest import make_regression  # noqa: E402


class Slow(Callback):
    def on_train_batch_end(self, trainer) -> None:
        if trainer.global_forward_batches == 1:
            open(sys.argv[2], "w").close()
        time.sleep(0.2)


model = LinearModel(3, 1)
Trainer(model, ArrayLoader(make_regression(), batch_size=8), SGD(model.params, model.grads, lr=0.05),
        driver="numpy", n_epochs=50, progress_bar=None,
        callbacks=[CheckpointCallback(sys.argv[1], every_n_batches=4), Slow()]).run()
