"""Tiny random HF PyTorch T5 checkpoints, built here (nothing is downloaded) for the T5 tests: the original T5
(ReLU feed-forward, LM head tied to the shared embedding) and T5 v1.1 / FLAN-T5 (gated-GELU, untied LM head)."""

from __future__ import annotations

import numpy as np

COMMON = dict(
    vocab_size=99,
    d_model=32,
    d_kv=8,
    d_ff=37,
    num_layers=2,
    num_decoder_layers=3,  # unlike the encoder's, so that mixing the stacks up fails
    num_heads=4,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=20,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)
VARIANTS = {
    "t5": dict(feed_forward_proj="relu", tie_word_embeddings=True),
    "flan": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}
SEEDS = {"t5": 0, "flan": 1}


def hf_config(variant: str, **overrides):
    import transformers

    return transformers.T5Config(**{**COMMON, **VARIANTS[variant], **overrides})


def build_hf_model(variant: str, directory=None, seed: int | None = None, **overrides):
    """A random HF `T5ForConditionalGeneration` of `variant` (eval mode), saved with safetensors to `directory` when
    given. The norm weights (HF starts them at one) get noise, so that each of them matters."""
    import torch
    import transformers

    torch.manual_seed(SEEDS[variant] if seed is None else seed)
    model = transformers.T5ForConditionalGeneration(hf_config(variant, **overrides)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                parameter.add_(0.2 * torch.randn_like(parameter))
    if directory is not None:
        model.save_pretrained(directory, safe_serialization=True)
    return model


def build_branching_model(variant: str, directory):
    """(HF model, tfgen's copy) of `variant` for generation tests, saved to `directory`. HF's T5 initialisation makes
    a tiny random model repeat one token forever; noise makes the searches branch. Queries (T5 does not scale
    attention scores) and the untied head are scaled down so the model stays as well conditioned in float32 as a
    trained one: HF's own float32 logits are then within ~2e-5 of float64."""
    import torch
    import transformers

    from tfgen.auto.models import AutoModelForSeq2SeqLM

    gated = variant == "flan"
    torch.manual_seed(5 if gated else 11)
    hf_model = transformers.T5ForConditionalGeneration(hf_config(variant)).eval()
    with torch.no_grad():
        for name, parameter in hf_model.named_parameters():
            parameter.add_(torch.randn_like(parameter) * (0.2 if gated else 0.7))
            if name.endswith(".q.weight"):
                parameter.mul_(0.25 if gated else 0.1)
        if gated:
            hf_model.lm_head.weight.mul_(0.25)
    hf_model.save_pretrained(directory, safe_serialization=True)
    return hf_model, AutoModelForSeq2SeqLM.from_pretrained(directory)


def build_checkpoints(tmp_path_factory) -> dict:
    """variant -> (checkpoint directory, HF torch model, our model loaded from the checkpoint), for every variant."""
    from tfgen.auto.models import AutoModelForSeq2SeqLM

    built = {}
    for variant in VARIANTS:
        directory = tmp_path_factory.mktemp(f"t5_{variant}")
        hf_model = build_hf_model(variant, directory)
        built[variant] = (str(directory), hf_model, AutoModelForSeq2SeqLM.from_pretrained(directory))
    return built


def hf_forward(hf_model, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask=None):
    """HF's plain forward: (float32 logits `[B, T_dec, V]`, encoder last hidden state `[B, S, D]`) as numpy."""
    import torch

    def tensor(value):
        return None if value is None else torch.tensor(np.asarray(value), dtype=torch.long)

    with torch.no_grad():
        out = hf_model(input_ids=tensor(input_ids), attention_mask=tensor(attention_mask),
                       decoder_input_ids=tensor(decoder_input_ids),
                       decoder_attention_mask=tensor(decoder_attention_mask))
    return out.logits.float().numpy(), out.encoder_last_hidden_state.float().numpy()


def padded_batch(lengths, width: int, side: str, seed: int = 0, vocab_size: int = 99):
    """(ids, mask) int32 `[len(lengths), width]`: row i has `lengths[i]` random real tokens (ids >= 2) on the left
    (`side="right"`: padding after them) or on the right (`side="left"`), padding id 0 under mask 0."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), width), np.int32)
    mask = np.zeros((len(lengths), width), np.int32)
    for row, length in enumerate(lengths):
        real = slice(0, length) if side == "right" else slice(width - length, width)
        ids[row, real] = rng.integers(2, vocab_size, length)
        mask[row, real] = 1
    return ids, mask


def word_level_t5_tokenizer():
    """A word-level `tfgen.Tokenizer` over the tiny T5's 99 ids: <pad>=0, </s>=1, <unk>=2, "w3" ... "w98"."""
    import tokenizers

    from tfgen import Tokenizer

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, 99)}}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return Tokenizer(backend, eos_token="</s>", pad_token="<pad>")


def unigram_t5_tokenizers():
    """(tfgen `Tokenizer`, HF `PreTrainedTokenizerFast`) of one SentencePiece-style vocabulary (Unigram pieces under a
    Metaspace pre-tokenizer and decoder, the kind of T5's own tokenizer) over the tiny T5's 99 ids: <pad>=0, </s>=1,
    <unk>=2, "▁"=3, the letters, then "▁"-prefixed two-letter words. HF's stop strings need a vocabulary that spells
    text (a word-level one makes HF raise)."""
    import itertools

    import tokenizers
    import transformers

    from tfgen import Tokenizer

    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -1.0), *((letter, -2.0) for letter in letters)]
    words = (f"▁{first}{second}" for first, second in itertools.product(letters, "aeiou"))
    pieces += [(word, -1.5) for word in itertools.islice(words, 99 - len(pieces))]
    backend = tokenizers.Tokenizer(tokenizers.models.Unigram(pieces, unk_id=2, byte_fallback=False))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    backend.decoder = tokenizers.decoders.Metaspace(replacement="▁", prepend_scheme="always")
    ours = Tokenizer(backend, eos_token="</s>", pad_token="<pad>")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", pad_token="<pad>",
                                              unk_token="<unk>")
    return ours, hf
