"""Tiny random keras-hub causal LMs for the adapter tests, with weights spread wide enough that greedy choices are
not near-ties (keras-hub initialises with stddev 0.02, where float rounding decides argmaxes)."""

from __future__ import annotations

import numpy as np


def randomize(causal_lm, seed: int) -> None:
    """Sets every float weight of `causal_lm` to random values: norm scales near 1, norm offsets near 0 (an offset
    near 1 in a final norm adds `embedding @ offset` to every logit, and one token then wins every step), everything
    else N(0, 0.3)."""
    rng = np.random.default_rng(seed)
    for variable in causal_lm.weights:
        if "float" not in str(variable.dtype):
            continue
        shape = tuple(variable.shape)
        if variable.path.endswith("beta"):
            value = 0.1 * rng.standard_normal(shape)
        elif "norm" in variable.path or variable.name in ("scale", "gamma"):
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            value = 0.3 * rng.standard_normal(shape)
        variable.assign(value.astype(np.float32))


def keras_hub_greedy(causal_lm, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
    """keras-hub's own greedy `generate()` of one unpadded prompt int `[1, P]`: int `[1, P + new_tokens]`."""
    import keras_hub

    causal_lm.compile(sampler=keras_hub.samplers.GreedySampler())
    length = prompt.shape[1] + new_tokens
    token_ids = np.zeros((prompt.shape[0], length), np.int32)
    token_ids[:, : prompt.shape[1]] = prompt
    padding_mask = np.zeros((prompt.shape[0], length), bool)
    padding_mask[:, : prompt.shape[1]] = True
    out = causal_lm.generate({"token_ids": token_ids, "padding_mask": padding_mask}, stop_token_ids=None)
    return np.asarray(out["token_ids"])
