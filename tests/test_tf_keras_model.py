"""The mixin works for a model written for Keras 2 (tf-keras): it only needs the cache protocol."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from conftest import left_padded_batch

from tfgen import GenerationConfig, TFGenerationMixin
from tfgen.decoding.model_protocol import CacheStepOutput


class _Config:
    vocab_size = 41
    max_position_embeddings = 32
    bos_token_id = None
    eos_token_id = None
    pad_token_id = 0


class TinyAttentionLM(TFGenerationMixin, tf_keras.Model):
    """One causal self-attention layer over token + position embeddings, written with tf-keras layers."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.config = _Config()
        self.generation_config = GenerationConfig(pad_token_id=0)
        init = tf_keras.initializers.RandomNormal(stddev=0.5, seed=3)
        self.token_embedding = tf_keras.layers.Embedding(_Config.vocab_size, width, embeddings_initializer=init)
        self.position_embedding = tf_keras.layers.Embedding(
            _Config.max_position_embeddings, width, embeddings_initializer=init
        )
        self.qkv = tf_keras.layers.Dense(3 * width, kernel_initializer=init)
        self.head = tf_keras.layers.Dense(_Config.vocab_size, kernel_initializer=init)
        self.width = width

    def _attend(self, hidden, keys, values, key_mask):
        scores = tf.einsum("bqd,bkd->bqk", hidden, keys) / np.sqrt(self.width)
        scores = tf.where(key_mask, scores, -1e9)
        return hidden + tf.einsum("bqk,bkd->bqd", tf.nn.softmax(scores, axis=-1), values)

    def call(self, input_ids, attention_mask):
        """Reference forward over a whole left-padded sequence: logits `[B, T, V]`."""
        positions = tf.maximum(tf.cumsum(attention_mask, axis=1) - 1, 0)
        x = self.token_embedding(input_ids) + self.position_embedding(positions)
        queries, keys, values = tf.split(self.qkv(x), 3, axis=-1)
        length = tf.shape(input_ids)[1]
        causal = tf.range(length)[None, :, None] >= tf.range(length)[None, None, :]
        key_mask = causal & (attention_mask[:, None, :] == 1)
        return self.head(self._attend(queries, keys, values, key_mask))

    def init_cache(self, batch_size, max_length, dtype=None):
        shape = [batch_size, max_length, self.width]
        return {"keys": tf.zeros(shape), "values": tf.zeros(shape)}

    def call_with_cache(self, input_ids, cache, cache_index, attention_mask, position_ids, last_logits_only=False):
        x = self.token_embedding(input_ids) + self.position_embedding(position_ids)
        queries, keys, values = tf.split(self.qkv(x), 3, axis=-1)
        new_length = tf.shape(input_ids)[1]
        slots = tf.range(tf.shape(cache["keys"])[1])
        written = (slots >= cache_index) & (slots < cache_index + new_length)
        # Scatter the new keys/values into their slots with a gather + select (static shapes).
        source = tf.clip_by_value(slots - cache_index, 0, new_length - 1)
        cache = {
            "keys": tf.where(written[None, :, None], tf.gather(keys, source, axis=1), cache["keys"]),
            "values": tf.where(written[None, :, None], tf.gather(values, source, axis=1), cache["values"]),
        }
        query_index = cache_index + tf.range(new_length)
        key_mask = (slots[None, None, :] <= query_index[None, :, None]) & (attention_mask[:, None, :] == 1)
        hidden = self._attend(queries, cache["keys"], cache["values"], key_mask)
        if last_logits_only:
            hidden = hidden[:, -1:]
        return CacheStepOutput(self.head(hidden), hidden, cache)


def _greedy_by_recomputation(model, ids, mask, new_tokens):
    """Greedy decoding the slow way: re-run the whole sequence for every token."""
    ids, mask = tf.constant(ids), tf.constant(mask)
    for _ in range(new_tokens):
        next_ids = tf.argmax(model(ids, mask)[:, -1], axis=-1, output_type=tf.int32)
        ids = tf.concat([ids, next_ids[:, None]], axis=1)
        mask = tf.concat([mask, tf.ones_like(next_ids)[:, None]], axis=1)
    return ids.numpy()


@pytest.fixture(scope="module")
def tf_keras_model():
    model = TinyAttentionLM()
    assert isinstance(model, tf_keras.Model)
    return model


@pytest.mark.parametrize("jit_compile", [True, False])
def test_tf_keras_model_greedy_equals_recomputation(tf_keras_model, jit_compile):
    ids, mask = left_padded_batch([[5, 9, 3, 7], [11, 4]])
    expected = _greedy_by_recomputation(tf_keras_model, ids, mask, 6)
    generated = tf_keras_model.generate(ids, attention_mask=mask, max_new_tokens=6, jit_compile=jit_compile)
    np.testing.assert_array_equal(generated.numpy(), expected)


def test_tf_keras_model_samples_with_seed(tf_keras_model):
    ids, mask = left_padded_batch([[5, 9, 3, 7]])
    first = tf_keras_model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=True, seed=[4, 2])
    again = tf_keras_model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=True, seed=[4, 2])
    np.testing.assert_array_equal(first.numpy(), again.numpy())
    assert first.shape == (1, 12)
