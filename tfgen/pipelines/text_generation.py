"""`tfgen.pipeline("text-generation", model=...)`: HF 4.55's `TextGenerationPipeline` over tfgen's `generate()`.

The pipeline takes what HF's takes and returns what it returns:
- a string: `[{"generated_text": str}]`, one record per returned sequence (`num_return_sequences`);
- a list of strings: one such list per string (all of them run as one left-padded batch, one `generate()` call;
  `batch_size=` cuts them into several);
- chat messages (a list of `{"role", "content"}` dicts): the conversation rendered with the model's chat template
  (the assistant's turn opened; a conversation ending in an assistant message is continued, HF's
  `continue_final_message`), and `[{"generated_text": messages + [{"role": "assistant", "content": answer}]}]`;
- a list of conversations: one such list per conversation.
`return_full_text=False` gives the new text only (a string, for chats too); `return_tensors=True` gives
`{"generated_token_ids": [...]}` (prompt and new tokens, without padding). Other keywords are `generate()`'s
(`max_new_tokens`, `do_sample`, `temperature`, `seed`, `stop_strings`, ...); given to `pipeline()` they are defaults
for every call.

Where tfgen differs from HF, on purpose:
- A plain string is continued as plain text, as HF's pipeline does, even on a chat model (the `tfgen` command and
  `tfgen batch` apply the chat template to plain prompts by default); pass messages to chat.
- The answer's length: when neither the call nor the model's generation config sets one, `max_new_tokens` is
  `tfgen.config.budget.answer_budget` (1,024 within the context: the answer runs to the end of its turn), not HF's
  pipeline default of 256, and a warning says when an answer used all of it. Sampling follows the model's
  generation config (HF's PyTorch pipeline defaults to `do_sample=True, temperature=0.7` under it).
- Several prompts run as one batch (HF runs them one by one unless `batch_size` is set); greedy tokens are the same,
  and a `seed` gives row i the key `generate()` gives row i of the batch.
- Refused by name (ValueError): `clean_up_tokenization_spaces` (the tokenizer's decoder decides),
  `handle_long_generation`, `stop_sequence` (use `stop_strings`), `padding`, `truncation`, and the
  `generate()` outputs beyond tokens (`return_dict_in_generate`, `output_scores`, `output_logits`).
"""

from __future__ import annotations

import enum
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from tfgen.auto.models import AutoModelForCausalLM
from tfgen.auto.sources import resolve_source
from tfgen.auto.tokenizer import AutoTokenizer
from tfgen.config.budget import answer_budget, budget_cut_message
from tfgen.config.generation_config import GenerationConfig
from tfgen.decoding.model_protocol import capabilities
from tfgen.hub.default_model import default_model_path
from tfgen.request.prepare import pad_token_id_of

TASKS = ("text-generation",)
# The pipeline's own parameters (HF's names); every other keyword goes to generate().
PIPELINE_PARAMETERS = ("return_full_text", "return_tensors", "return_text", "continue_final_message",
                       "add_special_tokens", "prefix", "batch_size")
# generate()'s arguments that are not GenerationConfig attributes (the pipeline passes the prompt and tokenizer).
GENERATE_ARGUMENTS = ("generation_config", "logits_processor", "seed", "jit_compile", "streamer", "stopping_criteria",
                      "assistant_model")
# HF's keywords that tfgen's pipeline does not take, and what to do instead.
REFUSED = {
    "clean_up_tokenization_spaces": "the tokenizer's decoder decides how decoded text is cleaned",
    "handle_long_generation": "a prompt that leaves no room in the context is refused; shorten it",
    "stop_sequence": "pass stop_strings=[...] (HF's stop_sequence turns each of its token ids into an eos id)",
    "padding": "the prompts are always left-padded into one batch",
    "truncation": "tokenize and truncate the prompt yourself (tokenizer(..., truncation=True, max_length=N)), then "
                  "call model.generate()",
    "return_dict_in_generate": "the pipeline returns text; call model.generate() for scores and logits",
    "output_scores": "the pipeline returns text; call model.generate() for scores and logits",
    "output_logits": "the pipeline returns text; call model.generate() for scores and logits",
    "input_ids": "the pipeline tokenizes its text inputs; call model.generate() with ids",
    "attention_mask": "the pipeline tokenizes its text inputs; call model.generate() with ids",
    "tokenizer": "give the tokenizer to tfgen.pipeline(..., tokenizer=...)",
}
_CONFIG_ATTRIBUTES = frozenset(name for name in vars(GenerationConfig()) if not name.startswith("_"))


class ReturnType(enum.Enum):
    """What a record holds (HF's names)."""

    TENSORS = 0
    NEW_TEXT = 1
    FULL_TEXT = 2


def pipeline(task: str | None = "text-generation", model: Any = None, tokenizer: Any = None, *, dtype=None,
             revision: str | None = None, token: str | bool | None = None, local_files_only: bool | None = None,
             **defaults) -> TextGenerationPipeline:
    """A text-generation pipeline (HF's `pipeline("text-generation", model=..., tokenizer=...)`).

    Args:
        task: "text-generation" (None means it too); another task is a ValueError.
        model: a model directory, GGUF file, keras-hub preset, Hub id or registered name ("smollm2-135m-instruct",
            pulled unless cached, as `tfgen --model NAME`), loaded with `tfgen.AutoModelForCausalLM`; a loaded
            model; None: the shipped default model.
        tokenizer: a `tfgen` tokenizer, or where to load one (`tfgen.AutoTokenizer`); default: the model's own
            (from the same source; a loaded model needs one given, unless it carries `.tokenizer`).
        dtype, revision, token, local_files_only: as `from_pretrained`'s, for a model and tokenizer loaded here.
        defaults: keywords of every call (see `TextGenerationPipeline.__call__`), checked by name now.
    Returns a `TextGenerationPipeline`. Bad arguments raise ValueError / TypeError before anything loads.
    """
    if task not in (None, *TASKS):
        raise ValueError(f"task {task!r} is not supported; supported: {', '.join(TASKS)}")
    split_options(defaults)
    hub_options = dict(revision=revision, token=token, local_files_only=local_files_only)
    if model is None:
        model = default_model_path()
    if isinstance(model, (str, os.PathLike)):
        source = resolve_source(model, **hub_options)
        if tokenizer is None:
            tokenizer = source
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = AutoTokenizer.from_pretrained(tokenizer, **hub_options)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **hub_options)
    else:
        if not callable(getattr(model, "generate", None)):
            raise TypeError(f"model must be a path, Hub id, registered name or a loaded tfgen model, got "
                            f"{type(model).__name__}")
        if dtype is not None or any(value is not None for value in hub_options.values()):
            raise ValueError("dtype, revision, token and local_files_only are for a model loaded here; the model "
                             "given is loaded already")
        tokenizer = getattr(model, "tokenizer", None) if tokenizer is None else tokenizer
        if tokenizer is None:
            raise ValueError("tokenizer: a loaded model needs its tokenizer too "
                             "(tfgen.pipeline(..., model=model, tokenizer=tfgen.AutoTokenizer.from_pretrained(...)))")
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    return TextGenerationPipeline(model, tokenizer, **defaults)


def split_options(options: dict) -> tuple[dict, dict]:
    """(pipeline parameters, generate() options) of a call's keywords; ValueError naming a refused or unknown one."""
    for name in options:
        if name in REFUSED:
            raise ValueError(f"{name}: not supported by tfgen's pipeline; {REFUSED[name]}")
        if name not in PIPELINE_PARAMETERS and name not in GENERATE_ARGUMENTS and name not in _CONFIG_ATTRIBUTES:
            raise ValueError(f"{name}: not a text-generation pipeline or generation option")
    parameters = {name: value for name, value in options.items() if name in PIPELINE_PARAMETERS}
    return parameters, {name: value for name, value in options.items() if name not in PIPELINE_PARAMETERS}


class TextGenerationPipeline:
    """Continues text and answers chats with `model.generate()`; call it (see `__call__`). `model` and `tokenizer`
    are the loaded pair; `defaults` the keywords of every call."""

    def __init__(self, model, tokenizer, **defaults):
        if capabilities(model).encoder_decoder:
            raise ValueError("model: an encoder-decoder model (T5) is not a text-generation model; call its "
                             "generate() with tokenized inputs")
        split_options(defaults)
        self.model = model
        self.tokenizer = tokenizer
        self.defaults = defaults

    def __call__(self, text_inputs, **options) -> list:
        """Generates for `text_inputs`: a string, a list of strings, a conversation (a list of `{"role",
        "content"}` dicts) or a list of conversations. Returns, per input, a list of one record per returned
        sequence — `{"generated_text": ...}` (the prompt and the new text; with `return_full_text=False` the new text
        only; for a conversation, the conversation with the answer appended as an assistant message) or
        `{"generated_token_ids": [...]}` with `return_tensors=True`; a single input gives its list, a list of inputs
        a list of them.

        Keywords: `return_full_text`, `return_tensors`, `return_text` (HF's exclusivity rules),
        `continue_final_message` (default: whether the last message is the assistant's), `add_special_tokens`
        (strings; default True), `prefix` (text put before each string prompt, left out of the returned text),
        `batch_size` (prompts per generate() call; default all), and generate()'s options."""
        parameters, generate_options = split_options({**self.defaults, **options})
        return_type = _return_type(parameters.get("return_full_text"), parameters.get("return_tensors"),
                                   parameters.get("return_text"))
        prompts, chats, single = _inputs(text_inputs)
        if chats and self.tokenizer.chat_template is None:
            raise ValueError("text_inputs: chat messages need a chat template, and this model's tokenizer has none; "
                             "pass plain text instead")
        continue_final = [_continues(chat, parameters.get("continue_final_message")) for chat in prompts] if chats \
            else [False] * len(prompts)
        encoded = [self._encode(prompt, chats, continuing, parameters) for prompt, continuing in
                   zip(prompts, continue_final)]
        batch_size = parameters.get("batch_size") or len(prompts)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        results = []
        for start in range(0, len(prompts), batch_size):
            rows = self._generate(encoded[start:start + batch_size], generate_options)
            for index, prompt_rows in enumerate(rows):
                number = start + index
                results.append([_record(self.tokenizer, prompts[number], prompt, tokens, return_type,
                                        continue_final[number]) for prompt, tokens in prompt_rows])
        return results[0] if single else results

    def _encode(self, prompt, chat: bool, continuing: bool, parameters: dict) -> list[int]:
        """The prompt's ids: a conversation rendered with the chat template (no special tokens added: the template
        writes them), a string with `prefix` before it and the tokenizer's special tokens unless
        `add_special_tokens=False`. An empty prompt is the model's bos token, where `generate()` starts one."""
        if chat:
            return list(self.tokenizer.apply_chat_template(prompt, add_generation_prompt=not continuing,
                                                           continue_final_message=continuing))
        text = (parameters.get("prefix") or "") + prompt
        ids = list(self.tokenizer.encode(text, add_special_tokens=parameters.get("add_special_tokens", True)))
        if not ids:
            bos_token_id = self.model.generation_config.bos_token_id
            if bos_token_id is None:
                raise ValueError("text_inputs: a prompt is empty and the model has no bos_token_id to start from")
            ids = [int(bos_token_id)]
        return ids

    def _generate(self, prompts: list[list[int]], options: dict) -> list[list[tuple[list[int], list[int]]]]:
        """One generate() call over `prompts` left-padded into a batch; per prompt, per returned sequence, (prompt
        ids, new ids up to where the row ended: its eos included, the padding after a stop left out)."""
        config = (options.get("generation_config") or self.model.generation_config).copy()
        config.update(**{name: value for name, value in options.items() if name in _CONFIG_ATTRIBUTES})
        pad_token_id = self.tokenizer.pad_token_id
        if pad_token_id is None:
            pad_token_id = pad_token_id_of(config)
        width = max(len(prompt) for prompt in prompts)
        ids = np.full((len(prompts), width), pad_token_id, np.int32)
        mask = np.zeros((len(prompts), width), np.int32)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = prompt
            mask[row, width - len(prompt):] = 1
        budget = None
        if "max_new_tokens" not in options and "max_length" not in options:
            max_positions = getattr(self.model.config, "max_position_embeddings", None)
            budget = answer_budget(config, width, max_positions)
            if budget is not None:
                options = {**options, "max_new_tokens": budget}
        sequences = self.model.generate(ids, attention_mask=mask, tokenizer=self.tokenizer, **options)
        sequences = np.asarray(sequences)
        per_prompt = sequences.shape[0] // len(prompts)
        eos_ids = set(config.eos_token_ids())
        stop_pad = pad_token_id_of(config)
        rows, cut = [], 0
        for number, prompt in enumerate(prompts):
            prompt_rows = []
            for sequence in sequences[number * per_prompt:(number + 1) * per_prompt]:
                new = _row_end(sequence[width:].tolist(), eos_ids, stop_pad)
                cut += budget is not None and len(new) == budget and not (new and new[-1] in eos_ids)
                prompt_rows.append((prompt, new))
            rows.append(prompt_rows)
        if cut:
            warnings.warn(f"{cut} of {sequences.shape[0]} answers: {budget_cut_message(budget, 'max_new_tokens=')}",
                          UserWarning, stacklevel=3)
        return rows


def _inputs(text_inputs) -> tuple[list, bool, bool]:
    """(prompts, whether they are conversations, whether one input was given) of a call's `text_inputs`."""
    if isinstance(text_inputs, str):
        return [text_inputs], False, True
    if not isinstance(text_inputs, (list, tuple)):
        raise TypeError(f"text_inputs must be a string, a list of strings, a conversation (a list of {{'role', "
                        f"'content'}} dicts) or a list of conversations, got {type(text_inputs).__name__}")
    if not text_inputs:
        raise ValueError("text_inputs is empty")
    if isinstance(text_inputs[0], dict):
        return [_conversation(text_inputs)], True, True
    if all(isinstance(item, str) for item in text_inputs):
        return list(text_inputs), False, False
    if all(isinstance(item, (list, tuple)) for item in text_inputs):
        return [_conversation(chat) for chat in text_inputs], True, False
    raise TypeError("text_inputs: a list must hold only strings, or only conversations (lists of {'role', "
                    "'content'} dicts)")


def _conversation(messages: Sequence) -> list[dict]:
    """`messages` checked as a conversation: a non-empty list of dicts with "role" and "content" (HF's check)."""
    if not messages:
        raise ValueError("text_inputs: a conversation is empty")
    for message in messages:
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError("text_inputs: each message of a conversation must be a dict with a 'role' and a "
                             f"'content' key, got {message!r}")
    return list(messages)


def _continues(chat: list[dict], continue_final_message: bool | None) -> bool:
    """Whether the answer continues the conversation's last message (HF's default: when it is the assistant's)."""
    return chat[-1]["role"] == "assistant" if continue_final_message is None else bool(continue_final_message)


def _return_type(return_full_text, return_tensors, return_text) -> ReturnType:
    """HF's choice of what a record holds, with its exclusivity errors."""
    if return_full_text is not None:
        if return_text is not None:
            raise ValueError("`return_text` is mutually exclusive with `return_full_text`")
        if return_tensors is not None:
            raise ValueError("`return_full_text` is mutually exclusive with `return_tensors`")
        return ReturnType.FULL_TEXT if return_full_text else ReturnType.NEW_TEXT
    if return_tensors:
        if return_text is not None:
            raise ValueError("`return_text` is mutually exclusive with `return_tensors`")
        return ReturnType.TENSORS
    return ReturnType.FULL_TEXT


def _row_end(new: list[int], eos_ids: set[int], pad_token_id: int) -> list[int]:
    """A row's new tokens up to where it ended: through its first eos id, else without the pad ids written after a
    stop string or criterion ended it (generate() pads finished rows to the batch's width)."""
    for position, token in enumerate(new):
        if token in eos_ids:
            return new[:position + 1]
    while new and new[-1] == pad_token_id:
        new = new[:-1]
    return new


def _record(tokenizer, prompt_input, prompt: list[int], new: list[int], return_type: ReturnType,
            continue_final: bool) -> dict:
    """One returned sequence as HF's pipeline writes it: the text is the whole sequence decoded (special tokens
    skipped) less the decoded prompt's characters, so that text joining across the prompt's end reads as HF's."""
    if return_type is ReturnType.TENSORS:
        return {"generated_token_ids": prompt + new}
    text = tokenizer.decode(prompt + new, skip_special_tokens=True)
    answer = text[len(tokenizer.decode(prompt, skip_special_tokens=True)):]
    if return_type is ReturnType.NEW_TEXT:
        return {"generated_text": answer}
    if isinstance(prompt_input, str):  # the prompt as given: a `prefix` stays out, as in HF
        return {"generated_text": prompt_input + answer}
    if continue_final:
        last = prompt_input[-1]
        return {"generated_text": prompt_input[:-1] + [{"role": last["role"], "content": last["content"] + answer}]}
    return {"generated_text": prompt_input + [{"role": "assistant", "content": answer}]}
