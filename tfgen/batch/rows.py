"""Input rows: the checks every row must pass, and the compact table of the valid ones (numpy only).

Records come from `tfgen.batch.inputs` as `(number, record)` pairs, a record being a dict `{"id", "prompt" |
"messages" | "input_ids", per-row options}` or an `Unreadable`; `build_table` validates, renders (chat rows:
`tfgen.batch.chatrows`) and tokenizes them in one pass and reports every bad row, not just the first.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from tfgen.batch.chatrows import conversation_text, messages_problem, user_message
from tfgen.batch.rowoptions import HONOURED, REFUSED, check_row_options, option_arrays, refused_key
from tfgen.value_types import is_integer

#: The keys a row is read for: its id, its prompt, and the per-row options, honoured or refused by name
#: (`tfgen.batch.rowoptions`). Other keys are metadata, left out as soon as a line is parsed (`read_keys`), except
#: those that misspell one of these (`misspelled_key`), which make the row bad.
ROW_KEYS = ("id", "prompt", "messages", "input_ids", *HONOURED, *REFUSED)
# An unknown key of 4 characters or more this close to a row key (difflib's ratio) is taken for a misspelling of it:
# "temprature", "promt", "seeds" are; metadata names such as "source", "prompt_id", "uid", "category" are not.
_MISSPELLING_CUTOFF = 0.85
_PROMPT_KEYS = ("prompt", "messages", "input_ids")

# Rows tokenized per tokenizer call: large enough for the tokenizer's batch speed, small enough to keep the
# texts of one chunk (not the whole input) in memory.
_TOKENIZE_CHUNK = 1024
# ... and at most this many prompt characters (or token ids) per call, a longer row being a call of its own: the
# tokenizer holds ~200 bytes per character of the texts it is given (16 MiB of code: 3.2 GB, measured).
_TOKENIZE_CHUNK_ITEMS = 1 << 20
#: An input line (JSONL) or record (TFRecord) may hold this many bytes per position of the model, and at least
#: `MIN_RECORD_BYTES`: room for any prompt the model can take (a token is a few bytes of JSON text, an id at most
#: 8), while a longer one, which could never fit, is a bad row refused before it is parsed or tokenized.
RECORD_BYTES_PER_POSITION = 64
MIN_RECORD_BYTES = 1 << 20
# Bad rows named in a message; the rest are counted (a file job writes them all to its skipped-rows file).
_SHOWN_BAD_ROWS = 20


def misspelled_key(key) -> str | None:
    """The row key (`ROW_KEYS`) an unknown key misspells ("temprature" -> "temperature", "Top-P" -> "top_p"), or
    None: a row key itself, or a metadata key."""
    if not isinstance(key, str) or key in ROW_KEYS:
        return None
    normalized = key.strip().lower().replace("-", "_").replace(" ", "_")
    if normalized in ROW_KEYS:
        return normalized
    close = difflib.get_close_matches(normalized, ROW_KEYS, n=1, cutoff=_MISSPELLING_CUTOFF) if len(key) >= 4 else []
    return close[0] if close else None


def read_keys(record, metadata: set):
    """A parsed row as a job reads it: its row keys, and unknown keys that misspell one (`misspelled_key`: the row
    is then bad, naming the key); its other keys are metadata, left out and added to `metadata` so that the reader
    warns once (`metadata_warning`). A record that is not a dict is returned as it is."""
    if not isinstance(record, dict):
        return record
    kept = {}
    for key, value in record.items():
        if key in ROW_KEYS or misspelled_key(key) is not None:
            kept[key] = value
        else:
            metadata.add(str(key))
    return kept


def metadata_warning(metadata: set) -> str:
    """The one warning of a job whose rows carry metadata keys (`read_keys`), naming them."""
    return (f"rows carry keys a batch job does not read, left out as metadata: {', '.join(map(repr, sorted(metadata)))}"
            f" (a job reads {', '.join(ROW_KEYS[:4])} and per-row options; docs/batch.md)")


def record_byte_limit(max_positions: int | None) -> int:
    """The most bytes an input line or record may hold for a model of `max_positions` positions (None: unknown)."""
    return max(MIN_RECORD_BYTES, RECORD_BYTES_PER_POSITION * (max_positions or 0))


def id_key(row_id) -> str:
    """Canonical text of an id: 1 and "1" stay different ids."""
    return json.dumps(row_id, ensure_ascii=False)


@dataclasses.dataclass(frozen=True)
class BadRow:
    """An input row that cannot be generated: its position (`unit` "line", "record" or "index", `number`),
    its id when it has a usable one, and why."""

    number: int
    id: Any
    reason: str
    unit: str = "line"

    def __str__(self) -> str:
        return f"{self.unit} {self.number}: {self.reason}"

    def to_json(self) -> dict:
        return {self.unit: self.number, "id": self.id, "error": self.reason}


class Unreadable(NamedTuple):
    """A record that could not even be parsed (bad JSON, not a tf.train.Example)."""

    reason: str


@dataclasses.dataclass(frozen=True)
class RowRules:
    """What a valid row needs: token ids inside the vocabulary and short enough for the model (`max_new_tokens`:
    the job's, or None while the job derives it from its prompts: then a row needs room for one), and how text
    becomes ids: `chat_prompts` renders `prompt` rows as a user message in the chat template, `template_kwargs` go
    to the template; `sampling`: whether the job samples (per-row sampling options need it)."""

    vocab_size: int
    max_prompt_tokens: int | None
    max_new_tokens: int | None
    bos_token_id: int | None
    tokenizer: Any
    unit: str
    chat_prompts: bool = False
    template_kwargs: dict = dataclasses.field(default_factory=dict)
    sampling: bool = False


@dataclasses.dataclass
class PromptTable:
    """The valid rows of an input, in input order.

    ids: each row's id as given (str or int). tokens: int32 `[total]`, every prompt's token ids back to back.
    offsets: int64 `[n + 1]`; row `i` is `tokens[offsets[i]:offsets[i + 1]]`. numbers: int64 `[n]`, each row's
    position in the input (line, record or index). options: the rows' own options as arrays
    (`tfgen.batch.rowoptions.option_arrays`; empty when no row gives one).
    """

    ids: list
    tokens: np.ndarray
    offsets: np.ndarray
    numbers: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros([0], np.int64))
    options: dict = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        """int64 `[n]` prompt lengths."""
        return np.diff(self.offsets)

    def prompt(self, row: int) -> np.ndarray:
        """int32 `[length]`: the token ids of row `row`."""
        return self.tokens[self.offsets[row] : self.offsets[row + 1]]

    def fingerprint(self) -> str:
        """sha256 of the ids and token ids: two inputs with the same fingerprint produce the same output."""
        digest = hashlib.sha256()
        digest.update("\n".join(id_key(row_id) for row_id in self.ids).encode())
        digest.update(self.offsets.astype("<i8").tobytes())
        digest.update(self.tokens.astype("<i4").tobytes())
        for name, values in sorted(self.options.items()):  # none without per-row options: fingerprints stay as before
            digest.update(name.encode() + np.ascontiguousarray(values).tobytes())
        return digest.hexdigest()

    def without(self, rows) -> PromptTable:
        """The table less the rows at indices `rows`."""
        keep = np.ones([len(self)], bool)
        keep[list(rows)] = False
        lengths = self.lengths[keep]
        return PromptTable(
            ids=[row_id for row_id, kept in zip(self.ids, keep) if kept],
            tokens=self.tokens[np.repeat(keep, self.lengths)],
            offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            numbers=self.numbers[keep],
            options={name: values[keep] for name, values in self.options.items()},
        )


def _check_record(record, rules: RowRules) -> tuple[str | None, Any]:
    """Returns (what is wrong or None, the row id or None) for one parsed record."""
    if isinstance(record, Unreadable):
        return record.reason, None
    if not isinstance(record, dict):
        return f"expected an object with 'id' and 'prompt' or 'input_ids', got {type(record).__name__}", None
    for key in record:
        if (meant := misspelled_key(key)) is not None:
            row_id = record.get("id")
            usable = isinstance(row_id, (int, str)) and not isinstance(row_id, bool)
            return f"unknown key {key!r} (did you mean {meant!r}?)", row_id if usable else None
    if "id" not in record:
        return "missing 'id'", None
    row_id = record["id"]
    if isinstance(row_id, bool) or not isinstance(row_id, (int, str)):
        return f"'id' must be a string or an integer, got {row_id!r}", None
    if isinstance(row_id, str) and (problem := _not_text(row_id, "'id'")):
        return problem, None  # the id could not be written to the output (nor to the skipped-rows file)
    if sum(key in record for key in _PROMPT_KEYS) != 1:
        return "needs exactly one of 'prompt' (text), 'messages' (a chat) and 'input_ids' (token ids)", row_id
    if problem := refused_key(record):
        return problem, row_id
    if "prompt" in record:
        if not isinstance(record["prompt"], str):
            return f"'prompt' must be a string, got {type(record['prompt']).__name__}", row_id
        if problem := _not_text(record["prompt"], "'prompt'"):
            return problem, row_id
        if rules.tokenizer is None:
            return "has a text 'prompt' but no tokenizer was given (pass one, or give 'input_ids')", row_id
    elif "messages" in record:
        if problem := messages_problem(record["messages"]):
            return problem, row_id
        if rules.tokenizer is None:
            return "has 'messages' but no tokenizer was given (pass the model's, which has the chat template)", row_id
        if getattr(rules.tokenizer, "chat_template", None) is None:
            return ("has 'messages', which need a chat template, and the model's tokenizer has none; give 'prompt' "
                    "rows to continue plain text"), row_id
    else:
        ids = record["input_ids"]
        if not isinstance(ids, list) or any(not is_integer(t) for t in ids):
            return "'input_ids' must be a list of integers", row_id
    return None, row_id


def _not_text(value: str, name: str) -> str | None:
    """What makes `value` something other than text, or None. JSON's `\\ud800` escapes decode to lone UTF-16
    surrogates, which no UTF-8 file or tokenizer can take."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        return (
            f"{name} holds a lone surrogate {value[error.start]!r} at character {error.start}, which is not text "
            "(UTF-8 cannot encode it)"
        )
    return None


def _encode(texts: list[str], tokenizer, add_special_tokens: bool = True) -> list:
    """Token ids per text, or the exception that text raised: the whole chunk in one tokenizer call, and text by
    text only when that call fails, so one text the tokenizer refuses is one bad row, not an aborted job. Rendered
    chats are encoded without `add_special_tokens` (their template writes its own, as in `apply_chat_template`)."""
    options = dict(padding=False, return_tensors=None, add_special_tokens=add_special_tokens)
    try:
        return tokenizer(texts, **options)["input_ids"]
    except Exception:  # noqa: BLE001 (retried text by text below: each failure becomes that row's reason)
        pass
    encoded = []
    for text in texts:
        try:
            encoded.append(tokenizer([text], **options)["input_ids"][0])
        except Exception as error:  # noqa: BLE001 (whatever the tokenizer raises, it is about this text)
            encoded.append(error)
    return encoded


def _texts(record: dict, rules: RowRules) -> tuple[str, bool] | Exception | None:
    """(the text to tokenize, whether it is a rendered chat) of a text row, the template's error, or None for a
    row of token ids."""
    if "messages" in record or ("prompt" in record and rules.chat_prompts):
        messages = record["messages"] if "messages" in record else user_message(record["prompt"])
        try:
            return conversation_text(rules.tokenizer, messages, rules.template_kwargs), True
        except (TypeError, ValueError) as error:
            return error
    return (record["prompt"], False) if "prompt" in record else None


def _check_tokens(tokens: list, rules: RowRules) -> tuple[str | None, list]:
    """Returns (what is wrong or None, the prompt ids to use); an empty prompt starts from bos."""
    outside = [t for t in tokens if not 0 <= t < rules.vocab_size]
    if outside:
        return f"token id {outside[0]} is outside the vocabulary [0, {rules.vocab_size})", tokens
    if not tokens:
        if rules.bos_token_id is None:
            return "the prompt is empty and the model has no bos_token_id to start from", tokens
        tokens = [rules.bos_token_id]
    if rules.max_prompt_tokens is not None and len(tokens) > rules.max_prompt_tokens:
        budget = rules.max_new_tokens or 1  # None: the job's budget is still to be derived; a row needs room for one
        return (
            f"the prompt has {len(tokens)} tokens; with max_new_tokens={budget} the model's "
            f"{rules.max_prompt_tokens + budget} positions leave room for {rules.max_prompt_tokens}"
        ), tokens
    return None, tokens


def _prompt_size(record) -> int:
    """Characters of a record's text prompt (or its messages' contents), or the length of its token-id list (0 for
    anything else)."""
    if not isinstance(record, dict):
        return 0
    if isinstance(record.get("messages"), list):
        contents = (m.get("content") if isinstance(m, dict) else None for m in record["messages"])
        return sum(len(content) for content in contents if isinstance(content, str))
    prompt = record.get("prompt", record.get("input_ids"))
    return len(prompt) if isinstance(prompt, (str, list)) else 0


def _chunks(records: Iterable[tuple[int, Any]]) -> Iterator[list]:
    """Lists of consecutive `(number, record)` pairs: `_TOKENIZE_CHUNK` of them, fewer when their prompts reach
    `_TOKENIZE_CHUNK_ITEMS` characters (or ids) together."""
    chunk, items = [], 0
    for pair in records:
        chunk.append(pair)
        items += _prompt_size(pair[1])
        if len(chunk) == _TOKENIZE_CHUNK or items >= _TOKENIZE_CHUNK_ITEMS:
            yield chunk
            chunk, items = [], 0
    if chunk:
        yield chunk


def build_table(records: Iterable[tuple[int, Any]], rules: RowRules) -> tuple[PromptTable, list[BadRow]]:
    """Validates, renders (chat rows) and tokenizes `(number, record)` pairs (records are dicts or `Unreadable`) in
    input order.

    Every problem is collected (none stops the scan), so one pass reports all bad rows, sorted by number. Ids
    must be unique across the whole input; a repeated id is bad even when its first row was bad for another
    reason.
    """
    ids, prompts, numbers, bad = [], [], [], []
    options: dict[int, dict] = {}
    first_seen: dict[str, int] = {}
    for chunk in _chunks(records):
        accepted = []
        for number, record in chunk:
            problem, row_id = _check_record(record, rules)
            if problem is None:
                problem, row_options = check_row_options(record, rules.sampling, rules.max_new_tokens)
            if row_id is not None and problem is None:
                key = id_key(row_id)
                if key in first_seen:
                    problem = f"duplicate id {row_id!r} (first on {rules.unit} {first_seen[key]})"
                else:
                    first_seen[key] = number
            if problem is None:
                accepted.append((number, row_id, record, row_options, _texts(record, rules)))
            else:
                bad.append(BadRow(number, row_id, problem, rules.unit))
        encoded = {}
        for rendered in (False, True):
            texts = [text[0] for *_, text in accepted if isinstance(text, tuple) and text[1] == rendered]
            encoded[rendered] = iter(_encode(texts, rules.tokenizer, not rendered) if texts else ())
        for number, row_id, record, row_options, text in accepted:
            if isinstance(text, Exception):
                problem = f"the chat template failed: {text}"
            else:
                tokens = record["input_ids"] if text is None else next(encoded[text[1]])
                if isinstance(tokens, Exception):
                    what = "the rendered chat" if text[1] else "'prompt'"
                    problem = f"the tokenizer failed on {what}: {type(tokens).__name__}: {tokens}"
                else:
                    problem, tokens = _check_tokens(tokens, rules)
            if problem is None:
                if row_options:
                    options[len(ids)] = row_options
                ids.append(row_id)
                prompts.append(np.asarray(tokens, np.int32))
                numbers.append(number)
            else:
                bad.append(BadRow(number, row_id, problem, rules.unit))
    bad.sort(key=lambda row: row.number)
    lengths = np.array([len(p) for p in prompts], np.int64)
    table = PromptTable(
        ids=ids,
        tokens=np.concatenate(prompts) if prompts else np.zeros([0], np.int32),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        numbers=np.array(numbers, np.int64),
        options=option_arrays(options, len(ids)),
    )
    return table, bad


def list_bad_rows(bad: Sequence[BadRow]) -> str:
    """One indented line per bad row ("  line 5: ..."), the first 20, then how many more there are."""
    shown = "\n".join(f"  {row}" for row in bad[:_SHOWN_BAD_ROWS])
    more = f"\n  ... and {len(bad) - _SHOWN_BAD_ROWS} more" if len(bad) > _SHOWN_BAD_ROWS else ""
    return shown + more


def bad_rows_message(bad: Sequence[BadRow], source: str) -> str:
    """The error message of an input (`source`) refused for its bad rows."""
    return f"{source}: {len(bad)} bad row(s), nothing was generated:\n{list_bad_rows(bad)}"
