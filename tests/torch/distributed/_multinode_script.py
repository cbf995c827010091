"""What each "node" of the multi-node tests runs under ``torchrun --nnodes 2 --nproc_per_node 1``.

    _multinode_script.py OUT DRIVER

Trains ``_fsdp_script``'s model and data with ``driver=DRIVER`` (``torch``: DDP, ``torch_fsdp``:
FSDP2), batch 4 per rank, and writes ``OUT/rank<r>.json``: the full parameters and where the
rank ran (its node rank and local rank), for the test to compare with one process.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import _fsdp_script as script  # noqa: E402 - the folder of this file is on sys.path when run as a script
import torch  # noqa: E402

torch.set_num_threads(1)


def main(out: str, driver: str) -> None:
    torch.manual_seed(0)
    trainer = script.build_trainer(script.Net(), batch_size=script.BATCH_PER_RANK, driver=driver, callbacks=[])
    trainer.run(num_eval_sanity_batch=0)
    d = trainer.driver
    result = {"rank": d.rank, "world_size": d.world_size, "driver": type(d).__name__,
              "group_rank": int(os.environ.get("GROUP_RANK", -1)), "local_rank": int(os.environ["LOCAL_RANK"]),
              "params": script.state_lists(d.model_state())}  # a collective for FSDP: every rank calls it
    with open(os.path.join(out, f"rank{d.rank}.json"), "w") as f:
        json.dump(result, f)
    print(f"rank-done {d.rank}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
