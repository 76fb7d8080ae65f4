"""How many new tokens an answer may take when the user did not say: the one rule of the commands (`tfgen generate`,
`tfgen chat`, `tfgen batch`, `tfgen export`'s buffer and so `tfgen serve`'s) and `tfgen.pipeline`.

`generate()` itself keeps HF's rule (20 new tokens unless the config or the call sets a length), so that it stays
token for token with HF. A person at a command line expects what llama.cpp and ollama do: the answer runs to the end
of its turn. The commands therefore fill in `max_new_tokens` when neither they nor the model's generation config set a
length: `DEFAULT_ANSWER_TOKENS`, within the context the prompt leaves. The loop ends at eos, so a large budget costs
only the static cache's size (all its columns are read every step: at 1,024 new tokens SmolLM2's cache adds ~9% to a
step's reads), which is why it is bounded rather than the whole context (8,192 positions for SmolLM2); a cut answer
says so on stderr (`budget_cut_message`).
"""

from __future__ import annotations

from tfgen.config.generation_config import GenerationConfig

#: New tokens of an answer when neither the command nor the model's generation config sets a length.
DEFAULT_ANSWER_TOKENS = 1024

_HF_DEFAULT_MAX_LENGTH = GenerationConfig().max_length


def config_sets_length(config: GenerationConfig) -> bool:
    """Whether the model's generation config sets a length (`max_new_tokens`, or a `max_length` other than HF's 20):
    then the commands keep it, as HF does."""
    return config.max_new_tokens is not None or config.max_length != _HF_DEFAULT_MAX_LENGTH


def answer_budget(config: GenerationConfig, prompt_length: int, max_positions: int | None) -> int | None:
    """`max_new_tokens` for a command whose user set none: None when the model's config sets a length (the call
    leaves it to the config), else `DEFAULT_ANSWER_TOKENS` within the `max_positions - prompt_length` positions the
    prompt leaves (at least 1, so that a prompt that fills the context is refused by `generate()` naming both
    numbers). `max_positions` None: the model has no position limit."""
    if config_sets_length(config):
        return None
    if max_positions is None:
        return DEFAULT_ANSWER_TOKENS
    return max(1, min(DEFAULT_ANSWER_TOKENS, int(max_positions) - int(prompt_length)))


#: Prompt positions an export's default budget leaves free (at most half the context), as `tfgen export`'s default
#: slot length adds to its budget.
EXPORT_PROMPT_ROOM = 256


def export_budget(config: GenerationConfig, max_positions: int | None) -> int | None:
    """The token buffer of an export (`tfgen export`, `tfgen serve` without EXPORT_DIR) whose user set none: None when
    the model's config sets a length, else `answer_budget` with room for a prompt of `EXPORT_PROMPT_ROOM` tokens (at
    most half the context). A served request without `max_new_tokens` may use the whole buffer, so the server's
    answers, like the commands', run to eos within it."""
    room = EXPORT_PROMPT_ROOM if max_positions is None else min(EXPORT_PROMPT_ROOM, int(max_positions) // 2)
    return answer_budget(config, room, max_positions)


def budget_cut_message(budget: int, flag: str = "--max-new-tokens") -> str:
    """The one stderr line when an answer stopped because it used all `budget` new tokens (not at eos or a stop
    string)."""
    return f"the answer was cut at {budget} new tokens (the budget, not the end of the turn); raise it with {flag} N"
