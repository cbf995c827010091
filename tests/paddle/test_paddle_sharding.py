"""paddle's group sharding, ``paddle_kwargs={"sharding": "os" | "os_g" | "p_g_os"}``.

On the CPU (every machine these tests run on so far) the option is refused when the Trainer
is built, with paddle's own reason and what to use instead, before any process starts; bad
values and combinations are refused naming what is accepted. The GPU test trains 2 ranks with
each level against plain data parallelism and round-trips a checkpoint; it runs this file as
the training script and is skipped without 2 CUDA devices (it has not run yet).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from drivetrain import DriverError, Trainer

pytestmark = pytest.mark.paddle

N, BATCH, STEPS = 64, 8, 4


def _loader() -> paddle.io.DataLoader:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    dataset = paddle.io.TensorDataset([paddle.to_tensor(x), paddle.to_tensor(y)])
    return paddle.io.DataLoader(dataset, batch_size=BATCH, shuffle=False)


class Net(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = paddle.nn.Linear(4, 16)
        self.fc2 = paddle.nn.Linear(16, 2)

    def forward(self, x, y=None):
        logits = self.fc2(paddle.nn.functional.relu(self.fc1(x)))
        return {"logits": logits, "loss": paddle.nn.functional.cross_entropy(logits, y)}


def _build(device="cpu", **options) -> Trainer:
    paddle.seed(0)
    model = Net()
    optimizer = paddle.optimizer.AdamW(learning_rate=0.01, parameters=model.parameters())
    return Trainer(model, _loader(), optimizer, driver="paddle", device=device, n_epochs=1, progress_bar=None,
                   input_mapping=lambda batch: {"x": batch[0], "y": batch[1]}, **options)


# ---------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("level", ["os", "os_g", "p_g_os"])
def test_sharding_on_the_cpu_is_refused_with_paddles_reason_and_the_alternative(level) -> None:
    with pytest.raises(DriverError) as caught:
        _build(nproc=2, paddle_kwargs={"sharding": level})
    message = str(caught.value)
    assert f"paddle_kwargs['sharding']={level!r} needs GPUs" in message
    assert "only support gpu, xpu and custom_device" in message  # paddle's own words
    assert "remove 'sharding'" in message and "driver='torch_fsdp'" in message
    assert not paddle.distributed.is_initialized()  # refused before any process started


@pytest.mark.parametrize(("options", "words"), [
    ({"sharding": "zero3"}, ["paddle_kwargs['sharding']='zero3' is not accepted", "'os', 'os_g', 'p_g_os'"]),
    ({"sharding": 2}, ["paddle_kwargs['sharding']=2 is not accepted", "'p_g_os'"]),
    ({"sharding": "os_g", "fleet": True}, ["'fleet': True", "remove 'fleet'"]),
], ids=["unknown-level", "not-a-string", "with-fleet"])
def test_a_bad_sharding_option_names_what_is_accepted(options, words) -> None:
    with pytest.raises(DriverError) as caught:
        _build(nproc=2, paddle_kwargs=options)
    for word in words:
        assert word in str(caught.value)


def test_sharding_in_one_process_says_to_train_distributed() -> None:
    with pytest.raises(DriverError) as caught:
        _build(paddle_kwargs={"sharding": "os_g"})
    assert "paddle_kwargs" in str(caught.value) and "'sharding'" in str(caught.value)
    assert "distributed" in str(caught.value)


def test_the_shares_of_an_optimizer_state_merge_back_into_the_whole_state() -> None:
    """What a stage-2 checkpoint gathers: each process's share of the accumulators (Adam's moments of its own
    parameters, the same accumulator names on every process) merged into one state, here split on the CPU."""
    from drivetrain_paddle._sharding import _to_numpy, merged_shares, share_of
    from drivetrain_paddle.state import optimizer_state

    paddle.seed(0)
    model = Net()
    optimizer = paddle.optimizer.AdamW(learning_rate=0.01, parameters=model.parameters())
    model(paddle.randn([8, 4]), paddle.randint(0, 2, [8]))["loss"].backward()
    optimizer.step()
    whole = _to_numpy(optimizer_state(model, optimizer, "optimizer_states()[0]"))
    shares = [share_of(whole, {"fc1.weight", "fc1.bias"}), share_of(whole, {"fc2.weight", "fc2.bias"})]
    assert all(len(per) == 2 for share in shares for per in share["accumulators"].values())  # each holds its half
    merged = merged_shares(shares)
    assert merged.keys() == whole.keys() and merged["learning_rate"] == whole["learning_rate"]
    assert merged["accumulators_on_cpu"] == whole["accumulators_on_cpu"]
    assert {base: sorted(per) for base, per in merged["accumulators"].items()} == {
        base: sorted(per) for base, per in whole["accumulators"].items()}
    for base, per in whole["accumulators"].items():
        for name, value in per.items():
            np.testing.assert_array_equal(merged["accumulators"][base][name], value)


# ---------------------------------------------------------------------------------- GPU
def _train(out: str, level: str) -> None:
    """2 GPU ranks started by the Trainer: ``level`` ('dp' for plain data parallelism), then a checkpoint."""
    options = {} if level == "dp" else {"paddle_kwargs": {"sharding": level}}
    trainer = _build(device=[0, 1], n_batches=STEPS, **options)
    trainer.run(num_eval_sanity_batch=0)
    folder = os.path.join(out, f"ckpt-{level}")
    if level == "p_g_os":  # its optimizer state is not checkpointed yet (refused): the weights
        trainer.save_model(folder)
    else:
        trainer.save_checkpoint(folder)
    driver = trainer.driver
    with driver.gathering_state():
        weights = {k: driver.tensor_to_numpy(v).tolist() for k, v in driver.model_state().items()}
    if driver.rank == 0:
        with open(os.path.join(out, f"{level}.json"), "w") as f:
            json.dump({"weights": weights, "describe": driver.describe()}, f)


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.skipif(not paddle.is_compiled_with_cuda() or paddle.device.cuda.device_count() < 2,
                    reason="group sharding needs 2 CUDA devices")
@pytest.mark.parametrize("level", ["os_g", "p_g_os"])
def test_group_sharding_on_two_gpus_trains_as_data_parallelism(level, tmp_path) -> None:
    for name in ("dp", level):
        done = subprocess.run([sys.executable, __file__, str(tmp_path), name], capture_output=True, text=True,
                              timeout=500)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    dp, sharded = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("dp", level))
    assert f"group sharding level {level!r}" in sharded["describe"]
    for name, values in dp["weights"].items():
        np.testing.assert_allclose(sharded["weights"][name], values, rtol=1e-4, atol=1e-5)
    paddle.seed(0)
    model = Net()
    single = Trainer(model, _loader(), paddle.optimizer.AdamW(learning_rate=0.01, parameters=model.parameters()),
                     driver="paddle", device="gpu:0", progress_bar=None,
                     input_mapping=lambda batch: {"x": batch[0], "y": batch[1]})
    if level == "p_g_os":
        single.load_model(str(tmp_path / f"ckpt-{level}"))
    else:
        single.load_checkpoint(str(tmp_path / f"ckpt-{level}"), resume_training=False)
    for name, values in sharded["weights"].items():
        np.testing.assert_allclose(model.state_dict()[name].numpy(), values, rtol=0, atol=0)


if __name__ == "__main__":  # the GPU test's training script (the Trainer starts rank 1 from it)
    _train(sys.argv[1], sys.argv[2])
