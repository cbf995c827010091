"""Hugging Face ``transformers`` models through the torch driver, end to end.

Every model is built from a tiny config with random weights and every tokenizer from a
vocabulary written into the test's temporary folder: nothing is downloaded, and the Hub
is switched off before ``transformers`` is imported so that nothing even tries.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="the ecosystem tests need transformers (pinned in tox.ini)")

from transformers import BertConfig, GPT2Config  # noqa: E402

VOCAB = 100
SEQ_LEN = 16


def bert_config(**overrides) -> BertConfig:
    """A 2-layer BERT with hidden size 32: ~60k parameters, a training step in milliseconds."""
    settings = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=SEQ_LEN, num_labels=2)
    return BertConfig(**{**settings, **overrides})


def gpt2_config(**overrides) -> GPT2Config:
    """A 2-layer GPT-2 with tied input/output embeddings (GPT-2's default).

    ``use_cache=False``: with the default ``True`` the model also returns its key/value
    cache (a ``Cache`` object, not a tensor) from every call, which evaluation and
    prediction have no use for.
    """
    settings = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=SEQ_LEN, use_cache=False,
                    bos_token_id=0, eos_token_id=0)
    return GPT2Config(**{**settings, **overrides})


def bag_of_words_samples(n: int, seed: int, *, with_labels: bool = True) -> list[dict]:
    """Fixed-length classification samples: class 0 draws its tokens from [5, 50), class 1 from [50, 100).

    Each sample is ``{"input_ids", "attention_mask", "labels"}``, the names a Hugging Face
    sequence classifier takes.
    """
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=gen)
    ids = torch.randint(5, 50, (n, SEQ_LEN), generator=gen) + 45 * labels[:, None]
    ids[:, 0] = 2  # a [CLS]-like first token, the position BERT's pooler reads
    samples = []
    for i in range(n):
        sample = {"input_ids": ids[i], "attention_mask": torch.ones(SEQ_LEN, dtype=torch.long)}
        if with_labels:
            sample["labels"] = labels[i]
        samples.append(sample)
    return samples


def counting_samples(n: int, seed: int) -> list[dict]:
    """Causal-LM samples that count up by one modulo the vocabulary from a random start: ``labels=input_ids``."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, VOCAB, (n, 1), generator=gen)
    ids = (starts + torch.arange(SEQ_LEN)) % VOCAB
    return [{"input_ids": ids[i], "labels": ids[i].clone()} for i in range(n)]
