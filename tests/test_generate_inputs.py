"""Bad input gets a clear ValueError/TypeError naming the argument, before anything compiles."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfgen import GenerationConfig

IDS = np.array([[5, 6, 7]], np.int32)


@pytest.mark.parametrize(
    "call, error, names",
    [
        (lambda m: m.generate(np.array([[5, 97]])), ValueError, "input_ids"),
        (lambda m: m.generate(np.array([[-1, 5]])), ValueError, "input_ids"),
        (lambda m: m.generate(np.array([[5.0, 6.0]])), TypeError, "input_ids"),
        (lambda m: m.generate(tf.constant([[5.0, 6.0]])), TypeError, "input_ids"),
        (lambda m: m.generate([[5, 6], [7]]), ValueError, "input_ids"),
        (lambda m: m.generate(np.array([5, 6, 7])), ValueError, "input_ids"),
        (lambda m: m.generate(IDS, attention_mask=np.ones([1, 2], np.int32)), ValueError, "attention_mask"),
        (lambda m: m.generate(IDS, attention_mask=np.array([[0, 2, 1]])), ValueError, "attention_mask"),
        (lambda m: m.generate(IDS, max_new_tokens=62), ValueError, "max_new_tokens"),
        (lambda m: m.generate(IDS, do_sample=True, temperature=-0.5), ValueError, "temperature"),
        (lambda m: m.generate(IDS, do_sample=True, top_p=1.5), ValueError, "top_p"),
        (lambda m: m.generate(IDS, do_sample=True, top_p=0.0), ValueError, "top_p"),
        (lambda m: m.generate(IDS, do_sample=True, seed=[1, 2, 3]), ValueError, "seed"),
        (lambda m: m.generate(IDS, do_sample=True, seed=[[1, 2], [3, 4]]), ValueError, "seed"),
        (lambda m: m.generate(IDS, do_sample=True, seed=[1.5, 2.0]), TypeError, "seed"),
        (lambda m: m.generate(IDS, max_new_token=5), ValueError, "max_new_token"),
        (lambda m: m.generate(IDS, generation_config={"max_new_tokens": 3}), TypeError, "generation_config"),
        (lambda m: m.generate(IDS, max_length=2), ValueError, "max_length"),
        (lambda m: m.generate(IDS, input_ids=IDS), ValueError, "input_ids"),
    ],
    ids=[
        "id_above_vocab",
        "negative_id",
        "float_ids",
        "float_tensor_ids",
        "ragged_ids",
        "one_dimensional_ids",
        "mask_shape",
        "mask_values",
        "beyond_positions",
        "negative_temperature",
        "top_p_above_one",
        "top_p_zero",
        "seed_length",
        "seed_rows",
        "float_seed",
        "unknown_option",
        "config_type",
        "max_length_below_prompt",
        "ids_twice",
    ],
)
def test_bad_input_is_rejected_before_compiling(tiny_model, call, error, names):
    traces = tiny_model.generate_trace_count
    with pytest.raises(error, match=names):
        call(tiny_model)
    assert tiny_model.generate_trace_count == traces


def test_empty_prompt_needs_a_bos_token(tiny_model):
    no_bos = GenerationConfig(bos_token_id=None, eos_token_id=2, pad_token_id=0)
    with pytest.raises(ValueError, match="bos_token_id"):
        tiny_model.generate(generation_config=no_bos, max_new_tokens=3)


def test_empty_prompt_starts_from_bos(tiny_model):
    out = tiny_model.generate(max_new_tokens=4, eos_token_id=None).numpy()
    assert out.shape == (1, 5) and out[0, 0] == tiny_model.config.bos_token_id
    empty = tiny_model.generate(np.zeros([2, 0], np.int32), max_new_tokens=4, eos_token_id=None).numpy()
    np.testing.assert_array_equal(empty, np.repeat(out, 2, axis=0))


def test_right_padding_warns(tiny_model):
    with pytest.warns(UserWarning, match="right-padded"):
        tiny_model.generate(np.array([[5, 6, 0]]), attention_mask=np.array([[1, 1, 0]]), max_new_tokens=2)


def test_inputs_as_lists_numpy_and_tensors_agree(tiny_model):
    as_list = tiny_model.generate([[5, 6, 7]], max_new_tokens=3, eos_token_id=None)
    as_tensor = tiny_model.generate(input_ids=tf.constant(IDS), max_new_tokens=3, eos_token_id=None)
    assert as_list.dtype == tf.int32 and as_list.shape == (1, 6)
    np.testing.assert_array_equal(as_list.numpy(), as_tensor.numpy())
