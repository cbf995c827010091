"""``transformers`` collators feeding a torch ``DataLoader``: batches padded to their own longest sample.

The tokenizer is read from a vocab.txt written into the test's folder. The docs'
example (examples/ecosystems/hf_bert.py, shown verbatim on
docs/ecosystems/huggingface.md) runs here, where transformers is installed.
"""

from __future__ import annotations

import importlib.util
import random
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from transformers import (
    BertTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    GPT2LMHeadModel,
)

import drivetrain
from drivetrain import CallbackError, Event, Trainer, seed_everything

from .conftest import gpt2_config

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "ecosystems" / "hf_bert.py"
DOC_PAGE = ROOT / "docs" / "ecosystems" / "huggingface.md"
WORDS = [f"w{i}" for i in range(95)]  # ids 5..99 after the five special tokens


class Crash(Exception):
    pass


def load_example():
    spec = importlib.util.spec_from_file_location("hf_bert_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ the docs' example
def test_the_docs_example_runs(tmp_path) -> None:
    example = load_example()
    started = time.perf_counter()
    out = example.main(str(tmp_path), progress_bar=None)
    elapsed = time.perf_counter() - started
    print(f"BERT + DataCollatorWithPadding: dev accuracy {out['dev_acc']:.3f}, {elapsed:.1f} s")
    assert out["dev_acc"] > 0.9  # chance is 0.5
    assert out["reloaded_dev_acc"] == out["dev_acc"]
    assert out["test_logits"].shape == (64, 2)
    np.testing.assert_allclose(out["reloaded_test_logits"], out["test_logits"], rtol=1e-5, atol=1e-6)


def test_the_example_pads_each_batch_to_its_own_length(tmp_path) -> None:
    example = load_example()
    tokenizer = example.build_tokenizer(str(tmp_path))
    assert len(tokenizer) == 95  # the vocabulary file was read, not a default one
    loader = DataLoader(example.make_samples(tokenizer, 128, seed=2), batch_size=32,
                        collate_fn=DataCollatorWithPadding(tokenizer))
    batches = list(loader)
    assert {"input_ids", "token_type_ids", "attention_mask", "labels"} == set(batches[0])
    assert len({b["input_ids"].shape[1] for b in batches}) > 1
    assert all(int(b["attention_mask"].sum(1).max()) == b["input_ids"].shape[1] for b in batches)


def test_the_docs_page_shows_the_example_verbatim() -> None:
    text = DOC_PAGE.read_text(encoding="utf-8")
    blocks = re.findall(r"^```python[^\n]*\n(.*?)^```$", text, flags=re.S | re.M)
    assert EXAMPLE.read_text(encoding="utf-8") in blocks, (
        f"{DOC_PAGE.relative_to(ROOT)} must show {EXAMPLE.relative_to(ROOT)} as one ```python block, verbatim")


def test_the_docs_next_token_metric_counts_what_it_says() -> None:
    text = DOC_PAGE.read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"^```python[^\n]*\n(.*?)^```$", text, flags=re.S | re.M)
               if "class NextTokenAccuracy" in b]
    namespace = {"Metric": drivetrain.Metric}
    exec(block, namespace)
    metric = namespace["NextTokenAccuracy"]()
    labels = np.array([[3, 4, 5, -100], [7, 8, 9, 1]])
    logits = np.eye(10)[[[4, 5, 0, 0], [8, 2, 1, 0]]]  # guesses the next token: right 2 of 2, then 2 of 3
    metric.update(logits=logits, labels=labels)
    assert metric.get_metric() == {"next_token_acc": 4 / 5}


# ------------------------------------------------------------- GPT-2, variable lengths
def counting_texts(lengths: list[int], seed: int) -> list[str]:
    """Runs of consecutive words (w7 w8 w9 ...), wrapping around the vocabulary."""
    rng = random.Random(seed)
    texts = []
    for n in lengths:
        start = rng.randrange(len(WORDS))
        texts.append(" ".join(WORDS[(start + k) % len(WORDS)] for k in range(n)))
    return texts


@pytest.fixture
def tokenizer(tmp_path) -> BertTokenizer:
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    return BertTokenizer.from_pretrained(str(tmp_path))


def lm_trainer(tokenizer: BertTokenizer, seed: int = 0, n_epochs: int = 2) -> Trainer:
    """GPT-2 trained through DataCollatorForLanguageModeling(mlm=False): labels = input_ids, padding -> -100."""
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(gpt2_config(pad_token_id=tokenizer.pad_token_id))
    lengths = random.Random(1).choices(range(3, 15), k=192)
    samples = [dict(tokenizer(t, return_token_type_ids=False)) for t in counting_texts(lengths, seed=1)]
    loader = DataLoader(samples, batch_size=16, shuffle=True,
                        collate_fn=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    return Trainer(model, loader, torch.optim.AdamW(model.parameters(), lr=1e-2), driver="torch", n_epochs=n_epochs,
                   progress_bar=None)


def test_language_modelling_collator_trains_gpt2(tokenizer) -> None:
    seed_everything(0)
    trainer = lm_trainer(tokenizer, n_epochs=5)
    losses = []
    trainer.add_callback_fn(Event.on_before_backward(), lambda t, outputs: losses.append(outputs["loss"].item()))
    trainer.run()
    first, last = np.mean(losses[:12]), np.mean(losses[-12:])
    print(f"GPT-2 + DataCollatorForLanguageModeling: mean loss of the first/last 12 batches {first:.3f} -> {last:.3f}")
    # the first word of each text and the end of the text cannot be predicted: the floor is about 0.7
    assert last < 0.5 * first


def test_collated_run_resumes_exactly(tokenizer, tmp_path) -> None:
    """The rebuilt DataLoader keeps the collator, so a mid-epoch resume sees the same padded batches."""
    seed_everything(0)
    reference = lm_trainer(tokenizer)
    reference.run()

    def save_then_crash(trainer: Trainer) -> None:
        if trainer.global_forward_batches == 15:
            trainer.save_checkpoint(tmp_path / "ckpt")
            raise Crash("out of memory")

    seed_everything(0)
    crashed = lm_trainer(tokenizer)
    crashed.add_callback_fn(Event.on_train_batch_end(), save_then_crash)
    with pytest.raises(CallbackError):
        crashed.run()

    resumed = lm_trainer(tokenizer, seed=3)
    resumed.run(resume_from=tmp_path / "ckpt")
    expected = reference.model.state_dict()
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, expected[name]), name
    assert resumed.model.lm_head.weight is resumed.model.transformer.wte.weight


def test_predict_pads_outputs_of_differently_padded_batches(tokenizer) -> None:
    """Per-token logits of batches 16, 10 and 6 tokens wide come back as one (20, 16, vocab) array.

    Positions past a batch's own width are filled with ``pad_value`` (-100); positions
    inside it hold the model's logits (padding tokens of shorter samples included).
    """
    seed_everything(0)
    trainer = lm_trainer(tokenizer, n_epochs=1)
    trainer.run()
    lengths = [14, 3, 9, 5, 12, 7, 8, 4] + [8, 2, 6, 3, 5, 7, 4, 8] + [4, 1, 2, 3]  # words; +2 special tokens
    samples = [dict(tokenizer(t, return_token_type_ids=False)) for t in counting_texts(lengths, seed=5)]
    loader = DataLoader(samples, batch_size=8, collate_fn=DataCollatorWithPadding(tokenizer))
    assert [b["input_ids"].shape[1] for b in loader] == [16, 10, 6]

    predictions = trainer.predict(loader)
    assert set(predictions) == {"logits"}
    logits = predictions["logits"]
    assert logits.shape == (20, 16, tokenizer.vocab_size)

    model = trainer.model.eval()
    for i, sample in enumerate(samples):
        n = len(sample["input_ids"])
        with torch.no_grad():
            alone = model(input_ids=torch.tensor([sample["input_ids"]])).logits[0]
        np.testing.assert_allclose(logits[i, :n], alone.numpy(), rtol=1e-4, atol=1e-5)
    for rows, width in ((slice(8, 16), 10), (slice(16, 20), 6)):
        assert (logits[rows, width:] == -100).all()
    assert not (logits[:8] == -100).any()

    custom = drivetrain.predict(model, loader, driver="torch", progress_bar=None, pad_value=0)
    assert (custom["logits"][16:, 6:] == 0).all()
