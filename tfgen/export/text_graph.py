"""The text halves of the exported `generate_text` signature (`text_tokenize`, `text_detokenize`), over a tokenizer
run as TF ops (`tfgen.text.in_graph`)."""

from __future__ import annotations

import tensorflow as tf


def text_signature_functions(text) -> dict:
    """`text_tokenize` (text string `[B]` -> left-padded input_ids / attention_mask `[B, T]`) and
    `text_detokenize` (sequences int32 `[B, T + N]`, prompt width int32 scalar, sequence_lengths `[B]` -> the
    generated text `[B]`) of an in-graph tokenizer `text`: the halves of `generate_text`, for a driver streaming
    text (`tfgen serve`)."""

    def tokenize(inputs):
        input_ids, attention_mask = text.encode(inputs["text"])
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def detokenize(inputs):
        return {"text": text.decode(inputs["sequences"], inputs["width"], inputs["sequence_lengths"])}

    text_spec = {"text": tf.TensorSpec([None], tf.string, name="text")}
    decode_spec = {"sequences": tf.TensorSpec([None, None], tf.int32, name="sequences"),
                   "width": tf.TensorSpec([], tf.int32, name="width"),
                   "sequence_lengths": tf.TensorSpec([None], tf.int32, name="sequence_lengths")}
    return {
        "text_tokenize": tf.function(tokenize, input_signature=[text_spec], autograph=False).get_concrete_function(),
        "text_detokenize": tf.function(detokenize, input_signature=[decode_spec],
                                       autograph=False).get_concrete_function(),
    }
