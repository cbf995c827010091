"""Train a Hugging Face BERT classifier with drivetrain, evaluate, predict, save and reload it.

    pip install "drivetrain[torch]" transformers==5.24.0
    python examples/ecosystems/hf_bert.py            # a few seconds on one CPU core

Everything is built here, offline: a 95-word vocabulary written to a temporary folder,
the tokenizer read from it, a 2-layer BERT with random weights, and a toy task (is
the one sentiment word in a text positive or negative?). For real work, load a
pretrained model and its tokenizer with from_pretrained(...) instead: the rest of
the script stays as it is.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing below needs the Hugging Face Hub

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    BertTokenizer,
    DataCollatorWithPadding,
)

import drivetrain  # noqa: E402
from drivetrain import Accuracy, Evaluator, Trainer  # noqa: E402

POSITIVE = ["good", "great", "fine", "nice", "superb"]
NEGATIVE = ["bad", "awful", "poor", "dull", "weak"]
FILLER = [f"w{i}" for i in range(80)]
MAX_LENGTH = 16


def build_tokenizer(folder: str) -> BertTokenizer:
    """A WordPiece tokenizer over a tiny vocabulary, written as vocab.txt and read back from the folder."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *POSITIVE, *NEGATIVE, *FILLER]
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(words) + "\n")
    return BertTokenizer.from_pretrained(folder)  # a local folder: read from disk, nothing downloaded


def make_samples(tokenizer: BertTokenizer, n: int, seed: int, labelled: bool = True) -> list[dict]:
    """Texts of 2 to 13 filler words with one sentiment word somewhere; label 1 = positive.

    Each sample is the tokenizer's output (input_ids, token_type_ids, attention_mask) of
    its own length, plus "label" when labelled.
    """
    rng = random.Random(seed)
    samples = []
    for _ in range(n):
        label = rng.randrange(2)
        words = rng.choices(FILLER, k=rng.randint(2, 13))
        words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label else NEGATIVE))
        sample = dict(tokenizer(" ".join(words), truncation=True, max_length=MAX_LENGTH))
        if labelled:
            sample["label"] = label  # DataCollatorWithPadding hands it to the model as "labels"
        samples.append(sample)
    return samples


def main(folder: str, n_epochs: int = 4, progress_bar: str | None = "auto") -> dict:
    torch.manual_seed(0)
    tokenizer = build_tokenizer(folder)
    collate = DataCollatorWithPadding(tokenizer)  # pads every batch to its own longest text
    train = DataLoader(make_samples(tokenizer, 320, seed=1), batch_size=16, shuffle=True, collate_fn=collate)
    dev = DataLoader(make_samples(tokenizer, 128, seed=2), batch_size=32, collate_fn=collate)
    test = DataLoader(make_samples(tokenizer, 64, seed=3, labelled=False), batch_size=32, collate_fn=collate)

    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=MAX_LENGTH, num_labels=2)
    model = BertForSequenceClassification(config)

    # The model takes the collated batch as it is and returns a ModelOutput with .loss and
    # .logits; Accuracy compares "logits" (its pred) with the batch's "labels" (its target).
    trainer = Trainer(model, train, torch.optim.AdamW(model.parameters(), lr=3e-3), driver="torch", device="cpu",
                      n_epochs=n_epochs, evaluate_dataloaders={"dev": dev}, metrics={"acc": Accuracy()},
                      progress_bar=progress_bar)
    trainer.run()
    results = trainer.evaluate()

    # Prediction on texts without labels: {"logits": array of shape (64, 2)}, in the test set's order.
    logits = trainer.predict(test)["logits"]

    # model.safetensors holds the model's state_dict under Hugging Face's parameter names.
    weights = trainer.save_model(os.path.join(folder, "bert-sentiment"))
    fresh = BertForSequenceClassification(config)
    fresh.load_state_dict(load_file(weights))
    reloaded = Evaluator(fresh, {"dev": dev}, {"acc": Accuracy()}, driver="torch", progress_bar=None,
                         verbose=0).run()
    fresh_logits = drivetrain.predict(fresh, test, driver="torch", progress_bar=None)["logits"]
    return {"dev_acc": results["acc#acc#dev"], "reloaded_dev_acc": reloaded["acc#acc#dev"],
            "test_logits": logits, "reloaded_test_logits": fresh_logits}


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        out = main(folder)
    print(f"dev accuracy {out['dev_acc']:.3f}; after reloading {out['reloaded_dev_acc']:.3f}; "
          f"test predictions {out['test_logits'].shape}, first classes {out['test_logits'][:8].argmax(-1)}")
    sys.exit(0 if out["dev_acc"] > 0.9 and out["reloaded_dev_acc"] == out["dev_acc"] else 1)
