"""What `tfgen generate` and `tfgen chat` share about an answer: whether the prompt goes through the model's chat
template, how many new tokens it may take when the user set no `--max-new-tokens` (`tfgen.config.budget`), and the
stderr lines that say an answer was cut by that budget or came back empty (never an empty answer without a word).

The lines go to the "tfgen" logger at warning level, which the command shows as `tfgen: <message>` on stderr (also
under `--quiet`).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def check_template_flags(chat: bool, raw: bool, system: str | None) -> None:
    """Refuses, before anything loads, `--chat` with `--raw` and `--system` with `--raw` (ValueError naming them)."""
    if chat and raw:
        raise ValueError("--chat / --raw: choose one (--chat answers through the chat template, --raw continues the "
                         "prompt as plain text)")
    if system is not None and raw:
        raise ValueError("--system is the system message of the chat template, which --raw leaves out")


def applies_chat_template(tokenizer, chat: bool, raw: bool, system: str | None, model_path: str) -> bool:
    """Whether the prompt is rendered as a user message with the tokenizer's chat template: by default when the model
    has one (ollama's and llama-cli's behaviour), never with `raw`. ValueError naming the flags for those
    `check_template_flags` refuses and for `--system` on a model without a template; MissingChatTemplateError
    (status 1) for `--chat` on a model without one."""
    from tfgen.text.chat_template import MissingChatTemplateError

    check_template_flags(chat, raw, system)
    has_template = tokenizer.chat_template is not None
    if chat and not has_template:
        raise MissingChatTemplateError(
            f"--chat needs a chat template, and the model {model_path!r} has none (no chat_template.jinja, no "
            "chat_template in tokenizer_config.json); leave out --chat to continue the prompt as plain text"
        )
    if system is not None and not has_template:
        raise ValueError(f"--system needs a chat template (it is the system message of the chat), and the model "
                         f"{model_path!r} has none")
    return has_template and not raw


def answer_length(model, max_new_tokens: int | None, prompt_length: int) -> int | None:
    """`max_new_tokens` for a call on a prompt of `prompt_length` tokens: the user's `max_new_tokens` when given, else
    `tfgen.config.budget.answer_budget` (None: the model's generation config sets a length, which the call keeps)."""
    from tfgen.config.budget import answer_budget

    if max_new_tokens is not None:
        return max_new_tokens
    max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return answer_budget(model.generation_config, prompt_length, max_positions)


def used_whole_budget(model, new_tokens, text: str, stop_strings) -> bool:
    """Whether one row's new tokens (int `[max_new_tokens]`, the columns after its prompt, as `generate()` returns
    them) ran to the end of the budget: a row that ends (eos, a stop string, `max_time`) writes the pad id in the
    columns after it, so the row ran out when its last column is neither eos nor pad and its text (`text`, the new
    tokens decoded with their special tokens) does not end with a stop string."""
    from tfgen.request.prepare import pad_token_id_of

    tokens = [int(token) for token in new_tokens]
    if not tokens:
        return False
    config = model.generation_config
    if tokens[-1] in {*config.eos_token_ids(), pad_token_id_of(config)}:
        return False
    return not any(text.endswith(stop) for stop in stop_strings or ())


def report_answer(model, tokenizer, new_tokens, budget_was_default: bool, stop_strings, raw_on_chat_model: bool):
    """The stderr lines after an answer (`new_tokens` int `[max_new_tokens]`): `budget_cut_message` when the default
    budget cut it (a budget the user set with `--max-new-tokens` is theirs: no line), and one line when it is empty."""
    from tfgen.config.budget import budget_cut_message

    new_tokens = [int(token) for token in new_tokens]
    if budget_was_default and used_whole_budget(model, new_tokens, tokenizer.decode(new_tokens), stop_strings):
        logger.warning(budget_cut_message(len(new_tokens)))
    if tokenizer.decode(new_tokens, skip_special_tokens=True).strip():
        return
    if raw_on_chat_model:
        logger.warning("the answer is empty: the model has a chat template and --raw continued the prompt as plain "
                       "text, which a chat model often ends at once; leave out --raw to answer through its template")
    else:
        logger.warning("the answer is empty: the model ended it at once (its first new token ended the text)")
