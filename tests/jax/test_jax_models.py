"""Real models nobody here wrote, built as flax's own docs build them (random weights, nothing downloaded): its MLP
and its MNIST CNN learn scikit-learn's digits to >= 0.93 dev accuracy, and the miniGPT of flax's language-model
tutorial (``nnx.MultiHeadAttention``, a causal mask, dropout) lowers its loss on a small token language."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from drivetrain import Accuracy, Evaluator, Trainer
from drivetrain_jax import DataLoader

from .conftest import CNN, MLP, cross_entropy, digits, logits_loss


class Flat(MLP):
    """flax's MLP on flattened 8x8 images."""

    def __call__(self, x):
        return super().__call__(x.reshape(x.shape[0], -1))


def test_flax_mlp_and_cnn_learn_digits():
    x, y, dev_x, dev_y = digits()
    train = DataLoader(list(zip(x, y, strict=True)), batch_size=32, shuffle=True, seed=0)
    dev = DataLoader(list(zip(dev_x, dev_y, strict=True)), batch_size=128)
    for model in (Flat(64, 128, 10, rngs=nnx.Rngs(0)), CNN(rngs=nnx.Rngs(0))):
        optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
        trainer = Trainer(model, train, optimizer, driver="jax", n_epochs=6, progress_bar=None,
                          input_mapping=lambda batch: {"x": batch[0], "target": batch[1]}, loss_fn=logits_loss)
        trainer.run()
        result = Evaluator(model, dev, {"acc": Accuracy()}, driver=trainer.driver, verbose=0,
                           input_mapping=lambda batch: {"x": batch[0], "target": batch[1]}).run()
        print(f"{type(model).__name__}: dev accuracy {result['acc#acc']:.3f}")
        assert result["acc#acc"] >= 0.93, result


class TransformerBlock(nnx.Module):
    """flax's miniGPT tutorial block: masked self-attention, dropout, post-norm residuals, a ReLU feed-forward."""

    def __init__(self, embed_dim: int, num_heads: int, ff_dim: int, *, rngs: nnx.Rngs, rate: float = 0.1) -> None:
        self.mha = nnx.MultiHeadAttention(num_heads=num_heads, in_features=embed_dim, decode=False, rngs=rngs)
        self.dropout1 = nnx.Dropout(rate=rate, rngs=rngs)
        self.layer_norm1 = nnx.LayerNorm(epsilon=1e-6, num_features=embed_dim, rngs=rngs)
        self.linear1 = nnx.Linear(embed_dim, ff_dim, rngs=rngs)
        self.linear2 = nnx.Linear(ff_dim, embed_dim, rngs=rngs)
        self.dropout2 = nnx.Dropout(rate=rate, rngs=rngs)
        self.layer_norm2 = nnx.LayerNorm(epsilon=1e-6, num_features=embed_dim, rngs=rngs)

    def __call__(self, inputs, mask):
        out1 = self.layer_norm1(inputs + self.dropout1(self.mha(inputs_q=inputs, mask=mask, decode=False)))
        return self.layer_norm2(out1 + self.dropout2(self.linear2(nnx.relu(self.linear1(out1)))))


class MiniGPT(nnx.Module):
    """Token and position embeddings, transformer blocks, a vocabulary projection (flax's miniGPT, smaller)."""

    def __init__(self, maxlen: int, vocab_size: int, embed_dim: int, num_heads: int, ff_dim: int, blocks: int, *,
                 rngs: nnx.Rngs) -> None:
        self.token_emb = nnx.Embed(vocab_size, embed_dim, rngs=rngs)
        self.pos_emb = nnx.Embed(maxlen, embed_dim, rngs=rngs)
        self.blocks = nnx.List([TransformerBlock(embed_dim, num_heads, ff_dim, rngs=rngs) for _ in range(blocks)])
        self.output_layer = nnx.Linear(embed_dim, vocab_size, rngs=rngs)

    def __call__(self, tokens):
        x = self.token_emb(tokens) + self.pos_emb(jnp.arange(tokens.shape[1])[None, :])
        mask = nnx.make_causal_mask(tokens)
        for block in self.blocks:
            x = block(x, mask)
        return self.output_layer(x)

    def train_step(self, tokens):
        logits = self(tokens[:, :-1])
        return {"loss": cross_entropy(logits, tokens[:, 1:])}


def sentences(n: int, length: int = 16, vocab: int = 24, seed: int = 0) -> np.ndarray:
    """Token sequences of a small language: each token follows from the two before it (mod ``vocab``)."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((n, length), np.int32)
    tokens[:, :2] = rng.integers(0, vocab, (n, 2))
    for i in range(2, length):
        tokens[:, i] = (tokens[:, i - 1] + 2 * tokens[:, i - 2] + 1) % vocab
    return tokens


def test_a_mini_gpt_with_multi_head_attention_lowers_its_loss():
    model = MiniGPT(maxlen=16, vocab_size=24, embed_dim=32, num_heads=2, ff_dim=64, blocks=2, rngs=nnx.Rngs(0))
    data = DataLoader(list(sentences(256)), batch_size=32, shuffle=True, seed=0)
    trainer = Trainer(model, data, nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param), driver="jax",
                      n_epochs=6, input_mapping=lambda tokens: {"tokens": tokens}, log_every_n_steps=1,
                      progress_bar=None)
    trainer.run()
    losses = [row["train/loss"] for row in trainer.history["train"]]
    first, last = float(np.mean(losses[:8])), float(np.mean(losses[-8:]))
    print(f"miniGPT: mean loss {first:.3f} over the first 8 steps, {last:.3f} over the last 8")
    assert last < 0.5 * first and "blocks.1.mha.query.kernel" in trainer.driver.model_state()
