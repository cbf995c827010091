"""Write tests/oneflow/torch_reference.npz: the parity problem trained by drivetrain's torch driver.

Run with the torch environment (torch cannot share the oneflow one):

    /work/main/.venv/bin/python tests/oneflow/make_torch_reference.py

It stores the loss of every step and the final parameters; test_oneflow_parity.py trains
the same problem with the oneflow driver and compares (fp32, relative tolerance 1e-5).
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _parity_problem import LR, REFERENCE, SIZES, batches, initial_weights  # noqa: E402


def main() -> None:
    import torch

    from drivetrain import Event, Trainer

    torch.set_num_threads(1)

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(SIZES[0], SIZES[1])
            self.fc2 = torch.nn.Linear(SIZES[1], SIZES[2])

        def forward(self, x, y):
            return {"loss": torch.nn.functional.cross_entropy(self.fc2(torch.tanh(self.fc1(x))), y)}

    model = MLP()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in initial_weights().items()})
    data = [{k: torch.from_numpy(v) for k, v in b.items()} for b in batches()]
    losses: list[float] = []
    trainer = Trainer(model, data, torch.optim.SGD(model.parameters(), lr=LR), driver="torch", n_epochs=1,
                      progress_bar=None)
    trainer.add_callback_fn(Event.on_before_backward(), lambda t, outputs: losses.append(float(outputs["loss"].detach())))
    trainer.run(num_eval_sanity_batch=0)
    final = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), REFERENCE)
    np.savez(path, losses=np.array(losses, np.float64), torch_version=np.array(torch.__version__), **final)
    print(f"wrote {path}: {len(losses)} losses, final loss {losses[-1]:.6f}")


if __name__ == "__main__":
    main()
