"""A Hugging Face GPT-2 causal language model, and its tied input/output embeddings.

Batches are ``{"input_ids", "labels"}`` with ``labels=input_ids`` (the model shifts
them itself); the sequences count up by one, a pattern two tiny layers learn in
seconds. GPT-2 ties ``lm_head.weight`` to ``transformer.wte.weight`` (one
``Parameter`` under two names): saving, reloading into a freshly built model and
resuming must keep it one parameter, and end where an uninterrupted run ends.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader
from transformers import GPT2LMHeadModel

import drivetrain
from drivetrain import CallbackError, Event, Metric, Trainer, seed_everything

from .conftest import SEQ_LEN, VOCAB, counting_samples, gpt2_config

N_TRAIN, N_DEV, BATCH = 192, 64, 16  # 12 training batches per epoch


class Crash(Exception):
    pass


class NextTokenAccuracy(Metric):
    """Share of positions whose most likely next token is the true one; labels of -100 are not counted.

    ``update`` takes Hugging Face's own names, ``logits`` and ``labels``: a metric may ask
    for any key of the batch or the outputs.
    """

    result_names = ("next_token_acc",)

    def __init__(self) -> None:
        super().__init__()
        self.register_element("correct", 0.0)
        self.register_element("total", 0.0)

    def update(self, logits: np.ndarray, labels: np.ndarray) -> None:
        guess, target = logits[:, :-1].argmax(-1), labels[:, 1:]
        counted = target != -100
        self.correct += (guess[counted] == target[counted]).sum()
        self.total += counted.sum()

    def get_metric(self) -> dict[str, float]:
        return {"next_token_acc": float(self.correct) / float(self.total) if float(self.total) else 0.0}


class MeanLoss(Metric):
    """The mean of the model's own (batch) loss over the evaluation batches."""

    result_names = ("loss",)

    def __init__(self) -> None:
        super().__init__()
        self.register_element("loss_sum", 0.0)
        self.register_element("batches", 0.0)

    def update(self, loss: np.ndarray) -> None:
        self.loss_sum += float(loss)
        self.batches += 1

    def get_metric(self) -> dict[str, float]:
        return {"loss": float(self.loss_sum) / float(self.batches) if float(self.batches) else 0.0}


def make_trainer(seed: int = 0, n_epochs: int = 3, lr: float = 1e-2, **kwargs) -> Trainer:
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(gpt2_config())
    train = DataLoader(counting_samples(N_TRAIN, seed=1), batch_size=BATCH, shuffle=True)
    dev = DataLoader(counting_samples(N_DEV, seed=2), batch_size=32)
    return Trainer(model, train, torch.optim.AdamW(model.parameters(), lr=lr), driver="torch", device="cpu",
                   n_epochs=n_epochs, evaluate_dataloaders={"dev": dev},
                   metrics={"next": NextTokenAccuracy(), "loss": MeanLoss()}, progress_bar=None, **kwargs)


def assert_tied(model: GPT2LMHeadModel) -> None:
    head, embedding = model.lm_head.weight, model.transformer.wte.weight
    assert head is embedding, "lm_head.weight and transformer.wte.weight are two parameters now"
    assert head.data_ptr() == embedding.data_ptr()
    assert len({id(p) for p in model.parameters()}) == len(list(model.parameters()))


def test_gpt2_causal_lm_learns_the_pattern() -> None:
    started = time.perf_counter()
    seed_everything(0)
    trainer = make_trainer()
    losses = []
    trainer.add_callback_fn(Event.on_before_backward(), lambda t, outputs: losses.append(outputs["loss"].item()))
    trainer.run(num_eval_sanity_batch=0)
    results = trainer.evaluate()
    elapsed = time.perf_counter() - started
    print(f"GPT-2: loss {losses[0]:.3f} -> {losses[-1]:.3f}, dev next-token accuracy "
          f"{results['next_token_acc#next#dev']:.3f}, dev loss {results['loss#loss#dev']:.3f}, {elapsed:.1f} s")
    assert losses[0] > 0.8 * np.log(VOCAB)  # random weights: about uniform over the vocabulary
    assert sum(losses[-12:]) / 12 < 0.25 * sum(losses[:12]) / 12
    assert results["next_token_acc#next#dev"] > 0.9  # chance is 1 in 100
    assert results["loss#loss#dev"] < 1.0


def test_gpt2_predict_gives_per_token_logits_in_order() -> None:
    seed_everything(0)
    trainer = make_trainer(n_epochs=1)
    trainer.run(num_eval_sanity_batch=0)
    samples = counting_samples(40, seed=3)
    unlabeled = DataLoader([{"input_ids": s["input_ids"]} for s in samples], batch_size=16)  # 16 + 16 + 8
    model = trainer.model.eval()
    with torch.no_grad():
        expected = model(input_ids=torch.stack([s["input_ids"] for s in samples])).logits

    predictions = trainer.predict(unlabeled)
    assert set(predictions) == {"logits"}
    assert predictions["logits"].shape == (40, SEQ_LEN, VOCAB)
    torch.testing.assert_close(torch.from_numpy(predictions["logits"]), expected)

    standalone = drivetrain.predict(model, unlabeled, driver="torch", progress_bar=None)
    torch.testing.assert_close(torch.from_numpy(standalone["logits"]), expected)


def test_tied_embeddings_survive_checkpoint_and_resume(tmp_path) -> None:
    seed_everything(0)
    reference = make_trainer(n_epochs=2)
    reference.run(num_eval_sanity_batch=0)
    assert_tied(reference.model)

    def save_then_crash(trainer: Trainer) -> None:
        if trainer.global_forward_batches == 17:  # epoch 2, batch 5 of 12
            trainer.save_checkpoint(tmp_path / "ckpt")
            raise Crash("power cut")

    seed_everything(0)
    crashed = make_trainer(n_epochs=2)
    crashed.add_callback_fn(Event.on_train_batch_end(), save_then_crash)
    with pytest.raises(CallbackError):
        crashed.run(num_eval_sanity_batch=0)

    seed_everything(7)
    resumed = make_trainer(seed=1, n_epochs=2)  # a fresh model with other weights
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert_tied(resumed.model)  # loading wrote both names into the one parameter
    resumed.run(resume_from=tmp_path / "ckpt", num_eval_sanity_batch=0)
    assert resumed.global_forward_batches == 24
    assert_tied(resumed.model)  # seven more AdamW steps on the shared parameter
    expected = reference.model.state_dict()
    resumed_state = resumed.model.state_dict()
    assert set(resumed_state) == set(expected)
    for name, value in resumed_state.items():
        assert torch.equal(value, expected[name]), name
    assert resumed.evaluate() == reference.evaluate()


def test_tied_embeddings_survive_save_model_and_reload(tmp_path) -> None:
    seed_everything(0)
    trainer = make_trainer(n_epochs=2)
    trainer.run(num_eval_sanity_batch=0)
    trained = trainer.evaluate()
    weights = trainer.save_model(tmp_path / "gpt2")
    saved = load_file(weights)
    assert {"lm_head.weight", "transformer.wte.weight"} <= set(saved)
    assert torch.equal(saved["lm_head.weight"], saved["transformer.wte.weight"])

    # a Trainer around a freshly built model
    fresh = make_trainer(seed=1, n_epochs=1, lr=1e-3)
    fresh.load_model(tmp_path / "gpt2")
    assert_tied(fresh.model)
    assert fresh.evaluate() == trained
    losses = []
    fresh.add_callback_fn(Event.on_before_backward(), lambda t, outputs: losses.append(outputs["loss"].item()))
    fresh.run(num_eval_sanity_batch=0)  # further training moves the shared weight as one
    assert_tied(fresh.model)
    assert torch.equal(fresh.model.lm_head.weight, fresh.model.transformer.wte.weight)
    assert losses[0] < 0.5 * np.log(VOCAB)  # it starts from the trained weights, not from scratch (~4.6)

    # plain torch: the safetensors file loads strictly into a new model and keeps the tie
    torch.manual_seed(2)
    plain = GPT2LMHeadModel(gpt2_config())
    plain.load_state_dict(load_file(weights))
    assert_tied(plain)
    for name, value in plain.state_dict().items():
        assert torch.equal(value, trainer.model.state_dict()[name]), name
