"""A Hugging Face BERT sequence classifier, used as its users write it: no mappings, no wrappers.

Batches are ``{"input_ids", "attention_mask", "labels"}``; the model returns a
``SequenceClassifierOutput`` with ``loss`` and ``logits``; the built-in ``Accuracy``
(``update(pred, target)``) reads ``logits`` and ``labels`` by their aliases.
"""

from __future__ import annotations

import time

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader
from transformers import BertForSequenceClassification

import drivetrain
from drivetrain import (
    Accuracy,
    CallbackError,
    DrivetrainError,
    Evaluator,
    Event,
    Trainer,
    seed_everything,
)

from .conftest import bag_of_words_samples, bert_config

N_TRAIN, N_DEV, BATCH = 192, 96, 16  # 12 training batches per epoch


class Crash(Exception):
    pass


def loaders(with_labels: bool = True) -> tuple[DataLoader, DataLoader]:
    train = DataLoader(bag_of_words_samples(N_TRAIN, seed=1), batch_size=BATCH, shuffle=True)
    dev = DataLoader(bag_of_words_samples(N_DEV, seed=2, with_labels=with_labels), batch_size=32)
    return train, dev


def make_trainer(seed: int = 0, n_epochs: int = 3, **kwargs) -> Trainer:
    torch.manual_seed(seed)
    model = BertForSequenceClassification(bert_config(**kwargs.pop("config", {})))
    train, dev = loaders()
    return Trainer(model, train, torch.optim.AdamW(model.parameters(), lr=3e-3), driver="torch", device="cpu",
                   n_epochs=n_epochs, evaluate_dataloaders={"dev": dev}, metrics={"acc": Accuracy()},
                   progress_bar=None, **kwargs)


def direct_logits(model: torch.nn.Module, loader: DataLoader) -> torch.Tensor:
    """The logits of a plain eval-mode call on every batch, for comparison."""
    model.eval()
    with torch.no_grad():
        return torch.cat([model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits for b in loader])


def test_bert_trains_and_accuracy_reads_logits_and_labels() -> None:
    started = time.perf_counter()
    seed_everything(0)
    trainer = make_trainer()
    losses, evaluations = [], []
    trainer.add_callback_fn(Event.on_before_backward(), lambda t, outputs: losses.append(outputs["loss"].item()))
    trainer.add_callback_fn(Event.on_evaluate_end(), lambda t, results: evaluations.append(results))
    trainer.run(num_eval_sanity_batch=0)
    results = trainer.evaluate()
    elapsed = time.perf_counter() - started
    print(f"BERT: loss {losses[0]:.3f} -> {losses[-1]:.3f}, dev accuracy {results['acc#acc#dev']:.3f}, "
          f"{elapsed:.1f} s")
    assert len(evaluations) == 4  # after each of the 3 epochs, then once more
    assert results["acc#acc#dev"] > 0.9  # chance is 0.5
    assert sum(losses[-12:]) / 12 < 0.5 * sum(losses[:12]) / 12


def test_bert_predict_returns_logits_in_dataset_order() -> None:
    seed_everything(0)
    trainer = make_trainer(n_epochs=1)
    trainer.run(num_eval_sanity_batch=0)
    _, unlabeled = loaders(with_labels=False)
    expected = direct_logits(trainer.model, unlabeled).numpy()

    predictions = trainer.predict(unlabeled, progress_bar=None)
    assert set(predictions) == {"logits"}  # the ModelOutput's None fields (loss, hidden states) left out
    assert predictions["logits"].shape == (N_DEV, 2)
    torch.testing.assert_close(torch.from_numpy(predictions["logits"]), torch.from_numpy(expected))

    standalone = drivetrain.predict(trainer.model, unlabeled, driver="torch", device="cpu", progress_bar=None)
    torch.testing.assert_close(torch.from_numpy(standalone["logits"]), torch.from_numpy(expected))


def test_bert_predict_on_labelled_batches_still_gives_per_sample_logits() -> None:
    """The test set often has labels: the model then returns a batch loss too, and prediction must cope."""
    seed_everything(0)
    trainer = make_trainer(n_epochs=1)
    _, dev = loaders()
    predictions = trainer.predict(dev, progress_bar=None)
    assert predictions["logits"].shape == (N_DEV, 2)
    torch.testing.assert_close(torch.from_numpy(predictions["logits"]), direct_logits(trainer.model, dev))


def test_bert_checkpoint_resumes_into_a_fresh_model_like_an_uninterrupted_run(tmp_path) -> None:
    """BERT has dropout: exact resume needs the weights, AdamW's state, the RNG and the data position."""
    seed_everything(0)
    reference = make_trainer(n_epochs=2)
    reference.run(num_eval_sanity_batch=0)

    def save_then_crash(trainer: Trainer) -> None:
        if trainer.global_forward_batches == 17:  # epoch 2, batch 5 of 12
            trainer.save_checkpoint(tmp_path / "ckpt")
            raise Crash("the machine went away")

    seed_everything(0)
    crashed = make_trainer(n_epochs=2)
    crashed.add_callback_fn(Event.on_train_batch_end(), save_then_crash)
    with pytest.raises(CallbackError):
        crashed.run(num_eval_sanity_batch=0)

    seed_everything(123)
    resumed = make_trainer(seed=1, n_epochs=2)  # another initialisation: everything comes from the checkpoint
    resumed.run(resume_from=tmp_path / "ckpt", num_eval_sanity_batch=0)
    assert resumed.global_forward_batches == 24
    expected = reference.model.state_dict()
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, expected[name]), name
    assert resumed.evaluate() == reference.evaluate()


def test_bert_saved_model_reloads_into_a_fresh_model(tmp_path) -> None:
    seed_everything(0)
    trainer = make_trainer(n_epochs=2)
    trainer.run(num_eval_sanity_batch=0)
    trained = trainer.evaluate()
    weights = trainer.save_model(tmp_path / "bert")

    # the file is plain safetensors with Hugging Face's own parameter names
    torch.manual_seed(1)
    fresh = BertForSequenceClassification(bert_config())
    fresh.load_state_dict(load_file(weights))
    _, dev = loaders()
    reloaded = Evaluator(fresh, {"dev": dev}, {"acc": Accuracy()}, driver="torch", progress_bar=None).run()
    assert reloaded == trained

    # and through a Trainer built around another fresh model
    other = make_trainer(seed=2)
    other.load_model(tmp_path / "bert")
    assert other.evaluate() == trained


def test_bert_plain_tuple_outputs_with_return_dict_false() -> None:
    """``return_dict=False``: the model returns ``(loss, logits)`` with labels and ``(logits,)`` without."""
    seed_everything(0)
    trainer = make_trainer(config={"return_dict": False})
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.evaluate()["acc#acc#dev"] > 0.9  # the tuple's second element is the prediction
    _, unlabeled = loaders(with_labels=False)
    predictions = trainer.predict(unlabeled, progress_bar=None)
    assert set(predictions) == {"pred"}
    assert predictions["pred"].shape == (N_DEV, 2)


def test_bert_loss_fn_when_the_batch_names_its_labels_otherwise() -> None:
    """Batches with ``y`` instead of ``labels``: the model returns logits only, ``loss_fn`` makes the loss."""

    def rename(samples: list[dict]) -> list[dict]:
        return [{"input_ids": s["input_ids"], "attention_mask": s["attention_mask"], "y": s["labels"]}
                for s in samples]

    seed_everything(0)
    model = BertForSequenceClassification(bert_config())
    train = DataLoader(rename(bag_of_words_samples(N_TRAIN, seed=1)), batch_size=BATCH, shuffle=True)
    dev = DataLoader(rename(bag_of_words_samples(N_DEV, seed=2)), batch_size=32)
    trainer = Trainer(model, train, torch.optim.AdamW(model.parameters(), lr=3e-3), driver="torch", n_epochs=3,
                      evaluate_dataloaders=dev, metrics={"acc": Accuracy()}, progress_bar=None,
                      loss_fn=lambda outputs, batch: torch.nn.functional.cross_entropy(outputs.logits, batch["y"]))
    trainer.run(num_eval_sanity_batch=0)
    assert trainer.evaluate()["acc#acc"] > 0.9  # target <- y


def test_input_mapping_is_what_the_model_the_metrics_and_the_callbacks_see() -> None:
    """Labels stored as ``label_ids``: one ``input_mapping`` renames them for the whole loop."""

    def stored_as_label_ids(samples: list[dict]) -> list[dict]:
        return [{"input_ids": s["input_ids"], "label_ids": s["labels"]} for s in samples]

    seed_everything(0)
    model = BertForSequenceClassification(bert_config())
    train = DataLoader(stored_as_label_ids(bag_of_words_samples(N_TRAIN, seed=1)), batch_size=BATCH, shuffle=True)
    dev = DataLoader(stored_as_label_ids(bag_of_words_samples(N_DEV, seed=2)), batch_size=32)
    trainer = Trainer(model, train, torch.optim.AdamW(model.parameters(), lr=3e-3), driver="torch", n_epochs=3,
                      evaluate_dataloaders=dev, metrics={"acc": Accuracy()}, progress_bar=None,
                      input_mapping={"label_ids": "labels"})
    seen = []
    trainer.add_callback_fn(Event.on_train_batch_begin(), lambda t, batch, indices: seen.append(sorted(batch)))
    trainer.run(num_eval_sanity_batch=0)  # the model computes its loss: it received "labels"
    assert seen[0] == ["input_ids", "labels"]
    assert trainer.evaluate()["acc#acc"] > 0.9  # Accuracy's target <- the mapped "labels"

    # the mapping the issue tried: evaluation batches renamed for the metric; the model ignores "target"
    evaluator = Evaluator(model, {"dev": DataLoader(bag_of_words_samples(N_DEV, seed=2), batch_size=32)},
                          {"acc": Accuracy()}, driver="torch", input_mapping={"labels": "target"},
                          progress_bar=None, verbose=0)
    assert evaluator.run()["acc#acc#dev"] > 0.9


def test_a_misnamed_label_key_is_reported_with_what_the_model_returned() -> None:
    """``label`` instead of ``labels``: BERT takes ``**kwargs``, ignores it and returns no loss."""
    samples = [{"input_ids": s["input_ids"], "label": s["labels"]} for s in bag_of_words_samples(32, seed=1)]
    model = BertForSequenceClassification(bert_config())
    trainer = Trainer(model, DataLoader(samples, batch_size=BATCH), torch.optim.AdamW(model.parameters()),
                      driver="torch", n_epochs=1, progress_bar=None)
    with pytest.raises(DrivetrainError) as info:
        trainer.run()
    message = str(info.value)
    assert "logits" in message and "loss" in message, message
