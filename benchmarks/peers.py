"""What is benchmarked: the same requests in every library, and one runner per library.

The peers are HF transformers' TF `generate` under `tf.function(jit_compile=True)` (`hf-tf`), keras-hub's
`GPT2CausalLM.generate` (`keras-hub`) and HF transformers' PyTorch `generate` (`hf-torch`); install them with
`pip install -e ".[bench]"`. Every library loads the same checkpoint: an HF-layout GPT-2 directory, or a GGUF
file, which tfgen and hf-torch dequantize to float32 and llama.cpp (`llama-cpp`, `benchmarks/llama_cpp_peer.py`)
runs quantized.
"""

from __future__ import annotations

import importlib
import os
import warnings

import numpy as np

LIBRARIES = ("tfgen", "tfgen-bf16", "tfgen-int8", "hf-tf", "keras-hub", "hf-torch", "llama-cpp")
DEFAULT_LIBRARIES = ("tfgen", "hf-tf", "keras-hub", "hf-torch")
PEERS = ("hf-tf", "keras-hub", "hf-torch", "llama-cpp")

# The same request in every library: HF generate keywords, and the keras-hub sampler that decodes alike.
BENCH_REQUESTS: dict[str, dict] = {
    "greedy": {"do_sample": False},
    "sample": {"do_sample": True, "top_k": 50, "top_p": 0.9},
    "beam": {"do_sample": False, "num_beams": 4},
    "contrastive": {"do_sample": False, "penalty_alpha": 0.6, "top_k": 4},
    # Speculative decoding (HF's assisted generation) with the prompt lookup drafter: greedy search's tokens. tfgen
    # at every batch; HF PyTorch at batch 1 only (its assisted generation refuses larger batches). Not in the default
    # runs: the random prompts give the lookup little to find (benchmarks/speculative.py measures it on real ones).
    "greedy-prompt-lookup": {"do_sample": False, "prompt_lookup_num_tokens": 8, "max_matching_ngram_size": 2},
}
# The strategies a run measures unless `--strategies` says otherwise.
DEFAULT_STRATEGIES = ("greedy", "sample", "beam", "contrastive")
# Strategies only tfgen and HF PyTorch implement (hf-tf's generate would take the option and decode plainly).
SPECULATIVE = ("greedy-prompt-lookup",)
# The requests whose tokens every library should agree on.
DETERMINISTIC = ("greedy", "beam", "contrastive", "greedy-prompt-lookup")


def bench_prompt(batch: int, prompt_len: int, vocab_size: int) -> np.ndarray:
    """The prompts of every library's requests: random token ids, int32 `[batch, prompt_len]`, seeded by
    `batch` so every run and process asks the same."""
    return np.random.default_rng(batch).integers(1, vocab_size, (batch, prompt_len)).astype(np.int32)


class Unavailable(Exception):
    """A library (or one of its strategies) cannot run here; the message says why."""


def short_error(error: BaseException) -> str:
    """One line of at most 300 characters for a report: the message of an `Unavailable`, else type and message."""
    text = f"{type(error).__name__}: {error}" if not isinstance(error, Unavailable) else str(error)
    return " ".join(text.split())[:300]


def is_gguf(checkpoint: str) -> bool:
    """Whether `checkpoint` is a GGUF file (llama.cpp's format) rather than an HF-layout directory. Not
    `tfgen.gguf.is_gguf_path`: importing tfgen configures XLA's compile cache, which a peer's process must not get."""
    return str(checkpoint).endswith(".gguf")


class Runner:
    """One library holding one model. `generate(strategy, input_ids)` takes int `[B, P]` prompts and returns
    the `new_tokens` generated tokens, int `[B, new_tokens]`."""

    def __init__(self, checkpoint: str, new_tokens: int):
        self.checkpoint, self.new_tokens = checkpoint, new_tokens

    def generate(self, strategy: str, input_ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class TfgenRunner(Runner):
    """tfgen's `AutoModelForCausalLM.generate` (XLA-compiled) with its default float32 weights."""

    dtype = None
    #: `from_pretrained` keywords of a variant (beyond `dtype`).
    load_options: dict = {}

    def __init__(self, checkpoint, new_tokens):
        super().__init__(checkpoint, new_tokens)
        from tfgen.auto.models import AutoModelForCausalLM

        try:
            self.model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=self.dtype, **self.load_options)
        except (TypeError, ValueError) as error:
            if not self.load_options:
                raise
            raise Unavailable(f"from_pretrained({self.load_options}) refused: {error}") from None

    def generate(self, strategy, input_ids):
        seed = [0, 0] if BENCH_REQUESTS[strategy]["do_sample"] else None
        try:
            out = self.model.generate(
                input_ids,
                attention_mask=np.ones_like(input_ids),
                max_new_tokens=self.new_tokens,
                eos_token_id=None,
                pad_token_id=0,
                seed=seed,
                **BENCH_REQUESTS[strategy],
            )
        except ValueError as error:
            if "not available" in str(error):
                raise Unavailable(str(error)) from None
            raise
        return np.asarray(out)[:, input_ids.shape[1] :]


class TfgenBf16Runner(TfgenRunner):
    """tfgen with bfloat16 weights and compute (`from_pretrained(..., dtype="bfloat16")`)."""

    dtype = "bfloat16"


class TfgenInt8Runner(TfgenRunner):
    """tfgen with int8 weights (`from_pretrained(..., quantize="int8")`, issue 34); its accuracy is measured by
    `python -m benchmarks.accuracy`."""

    load_options = {"quantize": "int8"}


class HfTfRunner(Runner):
    """HF transformers' `TFGPT2LMHeadModel.generate` under `tf.function(jit_compile=True)`."""

    def __init__(self, checkpoint, new_tokens):
        super().__init__(checkpoint, new_tokens)
        if is_gguf(checkpoint):
            raise Unavailable("HF transformers has no TF Llama and does not read GGUF into TF models")
        import tensorflow as tf

        transformers = _quiet_transformers()
        try:
            self.model = transformers.TFGPT2LMHeadModel.from_pretrained(checkpoint, from_pt=True)
        except Exception as error:  # noqa: BLE001 - any failure of the TF path is reported, not fatal
            raise Unavailable(f"TFGPT2LMHeadModel.from_pretrained failed: {type(error).__name__}: {error}") from None
        self.tf = tf
        # HF's documented XLA recipe: one traced program per input shape and generation options.
        self.xla_generate = tf.function(self.model.generate, jit_compile=True)

    def generate(self, strategy, input_ids):
        if strategy in SPECULATIVE:
            raise Unavailable(f"{strategy}: HF's TF generate has no assisted generation")
        options = dict(BENCH_REQUESTS[strategy])
        if options["do_sample"]:
            options["seed"] = [0, 0]  # stateless sampling, the XLA-compatible path
        ids = self.tf.constant(input_ids)
        out = self.xla_generate(
            ids,
            attention_mask=self.tf.ones_like(ids),
            max_new_tokens=self.new_tokens,
            eos_token_id=None,
            pad_token_id=0,
            **options,
        )
        return out.numpy()[:, input_ids.shape[1] :]


class KerasHubRunner(Runner):
    """keras-hub's `GPT2CausalLM.generate` with the sampler that decodes like each request."""

    def __init__(self, checkpoint, new_tokens):
        super().__init__(checkpoint, new_tokens)
        if is_gguf(checkpoint):
            raise Unavailable("keras-hub does not read GGUF files")
        self.keras_hub = import_peer("keras_hub", "keras-hub")
        # keras-hub converts HF-layout GPT-2 checkpoints itself when given their directory.
        self.backbone = self.keras_hub.models.GPT2Backbone.from_preset(checkpoint)
        self.models = {}  # one CausalLM per strategy: compile(sampler=) would drop the compiled function

    def _model(self, strategy):
        if strategy in SPECULATIVE:
            raise Unavailable(f"{strategy}: keras-hub has no speculative decoding")
        if strategy not in self.models:
            model = self.keras_hub.models.GPT2CausalLM(backbone=self.backbone, preprocessor=None)
            model.compile(sampler=keras_hub_sampler(strategy))
            self.models[strategy] = model
        return self.models[strategy]

    def generate(self, strategy, input_ids):
        return keras_hub_generate(self._model(strategy), input_ids, self.new_tokens)


def keras_hub_sampler(strategy: str):
    """The keras-hub sampler that decodes like `BENCH_REQUESTS[strategy]`."""
    import keras_hub

    samplers = keras_hub.samplers
    return {
        "greedy": lambda: samplers.GreedySampler(),
        "sample": lambda: samplers.TopPSampler(p=0.9, k=50, seed=0),
        "beam": lambda: samplers.BeamSampler(num_beams=4),
        "contrastive": lambda: samplers.ContrastiveSampler(k=4, alpha=0.6),
    }[strategy]()


def keras_hub_generate(causal_lm, input_ids: np.ndarray, new_tokens: int) -> np.ndarray:
    """`causal_lm.generate()` (with the sampler it was compiled with) of int `[B, P]` prompts, no stop token:
    the `new_tokens` generated tokens, int `[B, new_tokens]`."""
    batch, prompt_len = input_ids.shape
    # keras-hub generates into the unmasked slots of a fixed-length buffer, prompts at the start (right-padded).
    token_ids = np.zeros((batch, prompt_len + new_tokens), np.int32)
    token_ids[:, :prompt_len] = input_ids
    padding_mask = np.zeros(token_ids.shape, bool)
    padding_mask[:, :prompt_len] = True
    out = causal_lm.generate({"token_ids": token_ids, "padding_mask": padding_mask}, stop_token_ids=None)
    return np.asarray(out["token_ids"])[:, prompt_len:]


class HfTorchRunner(Runner):
    """HF transformers' PyTorch `generate`, on the CPU: `AutoModelForCausalLM` on the directory, or on a GGUF file
    through `gguf_file=` (dequantized to float32, as tfgen does)."""

    def __init__(self, checkpoint, new_tokens):
        super().__init__(checkpoint, new_tokens)
        self.torch = import_peer("torch", "torch")
        transformers = _quiet_transformers()
        if is_gguf(checkpoint):
            path = os.path.abspath(checkpoint)
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                os.path.dirname(path), gguf_file=os.path.basename(path), torch_dtype=self.torch.float32
            ).eval()
        else:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()

    def generate(self, strategy, input_ids):
        torch = self.torch
        torch.manual_seed(0)
        ids = torch.tensor(input_ids, dtype=torch.long)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # contrastive search's "moving to the Hub" notice
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=self.new_tokens,
                eos_token_id=hf_eos_token_id(self.model, BENCH_REQUESTS[strategy]),
                pad_token_id=0,
                **BENCH_REQUESTS[strategy],
            )
        return out.numpy()[:, input_ids.shape[1] :]


def hf_eos_token_id(model, options: dict):
    """The `eos_token_id` that lets HF PyTorch generate every new token: None, except for prompt lookup, which fails
    without one in transformers 4.55 (`torch.isin(ids, None)` in `PromptLookupCandidateGenerator`); it gets the last
    id of the vocabulary, which these models do not generate (a row that did would end early and show as a
    difference from tfgen's tokens)."""
    return model.config.vocab_size - 1 if options.get("prompt_lookup_num_tokens") else None


RUNNERS = {
    "tfgen": TfgenRunner,
    "tfgen-bf16": TfgenBf16Runner,
    "tfgen-int8": TfgenInt8Runner,
    "hf-tf": HfTfRunner,
    "keras-hub": KerasHubRunner,
    "hf-torch": HfTorchRunner,
}


def import_peer(module: str, package: str, install: str = 'pip install -e ".[bench]"'):
    """`import module`; raises `Unavailable` naming `package` and the command that installs it when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise Unavailable(f"{package} is not installed ({install})") from None


def _quiet_transformers():
    transformers = import_peer("transformers", "transformers")
    transformers.logging.set_verbosity_error()
    return transformers


def load_runner(library: str, checkpoint: str, new_tokens: int) -> Runner:
    """`library`'s runner holding `checkpoint`; raises `Unavailable` when the library cannot be imported."""
    try:
        if library == "llama-cpp":  # its own module, which builds on this one
            from benchmarks.llama_cpp_peer import LlamaCppRunner

            return LlamaCppRunner(checkpoint, new_tokens)
        return RUNNERS[library](checkpoint, new_tokens)
    except ImportError as error:
        raise Unavailable(f"{library}: {error}") from None
