"""The distributed runner: generates the planned groups of a `PromptTable` on every replica of a `tf.distribute`
strategy with generate()'s own compiled programs, and shapes the results into output records."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile

import numpy as np
import tensorflow as tf

from tfgen.batch.chatrows import check_template_kwargs
from tfgen.batch.grouprunner import GroupRunner
from tfgen.batch.planning import Group, check_job_seed, default_window
from tfgen.batch.rowoptions import over_budget
from tfgen.batch.rows import BadRow, PromptTable, RowRules, record_byte_limit
from tfgen.config.budget import answer_budget
from tfgen.generation import compile_cache
from tfgen.generation.programs import announce_compile, generate_program
from tfgen.request.buckets import DEFAULT_BUCKETS
from tfgen.request.prepare import (
    Request,
    ResolvedCall,
    pad_token_id_of,
    prepare_request,
    refuse_whole_call_options,
    resolve_call,
)
from tfgen.value_types import is_integer

# generate() arguments that a batch job sets itself, or whose meaning depends on how rows were padded together.
_JOB_CONTROLLED_OPTIONS = {
    "input_ids": "rows come from `prompts`",
    "attention_mask": "rows come from `prompts`",
    "max_length": "it counts the padded prompt, which depends on the batch; use max_new_tokens",
    "jit_compile": "batch jobs always run the compiled program",
    "max_time": "a job runs whole groups; stop the job instead, it resumes where it stopped",
    "stopping_criteria": "user criteria are traced per call; use stop_strings",
}


def _resolve_job_call(model, generation_config, generate_kwargs, tokenizer) -> ResolvedCall:
    """The job's call, resolved once for every group: `generation_config` (or the model's) updated with
    `generate_kwargs` (`max_new_tokens` still None when neither sets it: `BatchRunner.fit` derives it); raises for
    options a batch job cannot honour per row."""
    for name, why in _JOB_CONTROLLED_OPTIONS.items():
        if name in generate_kwargs:
            raise ValueError(f"{name}: not a batch option ({why}).")
    generate_kwargs = dict(generate_kwargs)
    call = resolve_call(model, generation_config, generate_kwargs, tokenizer=tokenizer,
                        assistant_model=generate_kwargs.pop("assistant_model", None))
    config = call.config
    refuse_whole_call_options(config, {
        "max_time": f"not a batch option ({_JOB_CONTROLLED_OPTIONS['max_time']}).",
        "num_return_sequences": "a batch job writes one continuation per row; repeat rows instead.",
    })
    if config.min_length:
        raise ValueError(
            f"min_length={config.min_length} counts the padded prompt, which depends on the batch; use min_new_tokens."
        )
    for flag in ("return_dict_in_generate", "output_scores", "output_logits"):
        if getattr(config, flag):
            raise ValueError(f"{flag}: a batch job writes ids and text only.")
    return call


def _derived_budget(config, longest: int, max_positions: int | None) -> int:
    """The job's `max_new_tokens` when neither the call nor the config sets one: the commands' answer budget
    (`tfgen.config.budget.answer_budget`) for the job's longest prompt (`longest` tokens). A config that sets only
    `max_length` (which counts the prompt) gives what it leaves after the longest prompt."""
    budget = answer_budget(config, longest, max_positions)
    if budget is None:
        budget = max(1, int(config.max_length) - longest)
        if max_positions is not None:
            budget = max(1, min(budget, int(max_positions) - longest))
    return budget


def _backing_variable(variable):
    # Keras 3 variables wrap the tf.Variable (a MirroredVariable etc. under a strategy) in `.value`.
    return variable if isinstance(variable, tf.Variable) else variable.value


def _model_digest(model) -> str:
    """sha256 over the model's architecture config and every value of every weight (with its position, shape
    and dtype), to refuse resuming a job with another model or a changed weight.

    The weights are Keras's `model.weights` (what `save_weights` writes: no random-generator state, which differs
    per process); a model without them (a plain `tf.Module`) gives its `variables` less the integer and boolean
    ones (such state). Variable names are left out: Keras prefixes them with the model's name, which is
    uniquified per process (the second model loaded is "..._1"), so the same checkpoint would not match itself.
    """
    digest = hashlib.sha256()
    config = getattr(getattr(model, "config", None), "to_dict", None)
    if callable(config):
        digest.update(json.dumps(config(), sort_keys=True, default=str).encode())
    weights = getattr(model, "weights", None)
    if weights is None:
        weights = [v for v in model.variables if not (tf.as_dtype(v.dtype).is_integer or v.dtype == tf.bool)]
    for index, variable in enumerate(weights):
        # One variable at a time on the host (a few seconds per GB of weights: cheap next to generating with them).
        value = np.ascontiguousarray(variable.numpy())
        digest.update(f"{index}:{value.shape}:{value.dtype.str}:{value.dtype.name};".encode())
        digest.update(memoryview(value.reshape(-1).view(np.uint8)))
    return digest.hexdigest()


def _tokenizer_digest(tokenizer) -> str | None:
    """sha256 of the files `tokenizer.save_pretrained` writes (vocabulary, merges, special tokens, padding
    side): it decodes the output's `text` and matches `stop_strings`. None without a tokenizer."""
    if tokenizer is None:
        return None
    save_pretrained = getattr(tokenizer, "save_pretrained", None)
    if not callable(save_pretrained):
        raise TypeError(
            f"tokenizer: a batch job needs a tokenizer with save_pretrained (a tfgen.Tokenizer), to record which "
            f"tokenizer wrote its text; got {type(tokenizer).__name__}"
        )
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory() as directory:
        try:
            save_pretrained(directory)
        except Exception as error:  # noqa: BLE001 (the Rust tokenizer raises a bare Exception for its OS errors)
            # A full disk or a file size limit (`ulimit -f`): one line saying what could not be written and why.
            raise OSError(
                f"tokenizer: could not write it to a temporary folder ({directory}) to take its digest for the "
                f"job's manifest: {type(error).__name__}: {error}"
            ) from error
        for name in sorted(os.listdir(directory)):
            with open(os.path.join(directory, name), "rb") as file:
                digest.update(f"{name}:".encode() + hashlib.sha256(file.read()).digest())
    return digest.hexdigest()


class BatchRunner(GroupRunner):
    """Runs the planned groups of a `PromptTable` on the replicas of a strategy with the model's compiled programs
    (windows, row keys and output records: `GroupRunner`).

    `around_compile`: a factory of a context manager entered around a step whose program compiles (a progress
    bar steps out of the way of the compile notice); default: nothing.
    """

    def __init__(self, model, strategy, generation_config, tokenizer, batch_size, window, seed, generate_kwargs, *,
                 raw: bool = False, chat_template_kwargs: dict | None = None):
        if not is_integer(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if window is not None and (not is_integer(window) or window < 1):
            raise ValueError(f"window must be a positive integer (rows), got {window!r}")
        self.strategy = strategy or tf.distribute.get_strategy()
        if not all(self.strategy.extended.variable_created_in_scope(_backing_variable(v)) for v in model.variables):
            raise ValueError(
                "model: its weights were not created under this strategy's scope; build or load the model inside "
                "`with strategy.scope():` so that every replica holds a copy."
            )
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.window = window  # None: `fit` derives it from the rows (`default_window`)
        self.job_seed = check_job_seed(seed)
        self.template_kwargs = check_template_kwargs(chat_template_kwargs, tokenizer)
        # Prompt rows on a model with a chat template become a user message in it, as `tfgen generate` does.
        self.chat_prompts = not raw and getattr(tokenizer, "chat_template", None) is not None
        self.call = _resolve_job_call(model, generation_config, generate_kwargs, tokenizer)
        self.config = self.call.config
        self.derive_budget = self.config.max_new_tokens is None
        # The config as resolved, which preparing a request changes (it sets `max_length`): `fit` derives from it.
        self._unprepared_config = self.config.copy()
        # The call's own copy of the config (its processors do not depend on the budget); until `fit` derives the
        # job's budget, a row needs room for one new token.
        self.max_new_tokens = 1 if self.derive_budget else int(self.config.max_new_tokens)
        self.config.max_new_tokens = self.max_new_tokens
        self.eos_ids = self.config.eos_token_ids()
        self.pad_id = pad_token_id_of(self.config, int(model.config.vocab_size))
        self.buckets = getattr(model, "generation_buckets", DEFAULT_BUCKETS)
        self.replicas = self.strategy.num_replicas_in_sync
        self._step_functions: dict = {}
        self.around_compile = contextlib.nullcontext
        # Preparing one row now surfaces every option error (unsupported mode, bad values) before any input is read.
        self._request(None, None, self.buckets.prompt_length(1))

    def rules(self, unit: str) -> RowRules:
        """What a row of this job must satisfy; `unit` names row positions in messages ("line", "index", ...)."""
        max_positions = getattr(self.model.config, "max_position_embeddings", None)
        return RowRules(
            vocab_size=int(self.model.config.vocab_size),
            max_prompt_tokens=None if max_positions is None else int(max_positions) - self.max_new_tokens,
            max_new_tokens=None if self.derive_budget else self.max_new_tokens,
            bos_token_id=self.config.bos_token_id,
            tokenizer=self.tokenizer,
            unit=unit,
            chat_prompts=self.chat_prompts,
            template_kwargs=self.template_kwargs,
            sampling=bool(self.config.do_sample),
        )

    def fit(self, table: PromptTable, unit: str) -> tuple[PromptTable, list[BadRow]]:
        """Settles what depends on the valid rows of `table`, before `settings` and `windows`: the window
        (`default_window`, unless given) and, when neither the call nor the config sets it, the job's
        `max_new_tokens` (`_derived_budget` of the longest prompt). Returns the table less the rows whose own
        `max_new_tokens` exceeds the job's, and those rows as bad rows (`unit` as in `rules`)."""
        if self.window is None:
            self.window = default_window(len(table), self.batch_size)
        if self.derive_budget:
            longest = int(table.lengths.max(initial=1))
            max_positions = getattr(self.model.config, "max_position_embeddings", None)
            self.max_new_tokens = _derived_budget(self._unprepared_config, longest, max_positions)
            self.config.max_new_tokens = self.max_new_tokens
            self.derive_budget = False
        own = table.options.get("max_new_tokens")
        over = [] if own is None else np.flatnonzero(own > self.max_new_tokens).tolist()
        bad = [
            BadRow(int(table.numbers[row]), table.ids[row],
                   f"'max_new_tokens' {over_budget(int(own[row]), self.max_new_tokens)}", unit)
            for row in over
        ]
        return (table.without(over) if over else table), bad

    def max_record_bytes(self) -> int:
        """The most bytes an input line or record of this job may hold (`tfgen.batch.rows.record_byte_limit`)."""
        return record_byte_limit(getattr(self.model.config, "max_position_embeddings", None))

    def settings(self) -> dict:
        """Everything besides the input that decides the output (a resumed job must match it exactly); after `fit`."""
        if self.window is None or self.derive_budget:
            raise RuntimeError("BatchRunner.settings: call fit(table) first (it settles the window and the budget)")
        return {
            "model": _model_digest(self.model),
            "tokenizer": _tokenizer_digest(self.tokenizer),
            "generation_config": json.loads(self.config.to_json_string()),
            "seed": self.job_seed.tolist(),
            "batch_size": self.batch_size,
            "window": self.window,
            "buckets": dataclasses.asdict(self.buckets),
        }

    def _with_row_knobs(self, request: Request, table: PromptTable, rows) -> Request:
        """`request` with the rows' own `temperature` / `top_p` (per-row knobs of a sampling program)."""
        knobs = dict(request.inputs.knobs)
        for name in ("temperature", "top_p"):
            values = table.options.get(name)
            given = None if values is None else ~np.isnan(values[rows])
            if given is None or not given.any():
                continue
            column = knobs[name].numpy().copy()  # the rows checks let only sampling jobs give them: a knob there
            column[: len(rows)][given] = values[rows][given]
            knobs[name] = tf.constant(column)
        return dataclasses.replace(request, inputs=request.inputs._replace(knobs=knobs))

    def _request(self, table: PromptTable | None, group: Group | None, width: int) -> Request:
        """The generate request of one group at `width` columns (`None`: a filler group whose rows generate
        nothing), every row with `max_new_tokens` to generate but the filler rows, which get 0."""
        rows = group.rows if group is not None else ()
        ids, mask = self.padded_prompts(table, rows, width)
        seeds = None
        if self.config.do_sample:
            seeds = np.zeros((self.batch_size, 2), np.int32)
            if len(rows):
                seeds[: len(rows)] = self.row_keys(table, rows)
        request = prepare_request(self.model, ids, call=self.call, seed=seeds, attention_mask=mask)
        budgets = np.zeros([self.batch_size], np.int32)
        if len(rows):
            budgets[: len(rows)] = self.row_budgets(table, rows)
            if table.options:
                request = self._with_row_knobs(request, table, rows)
        return request.with_budgets(budgets)

    def run_step(self, table: PromptTable, step: list[Group | None]) -> list[list]:
        """Runs one group per replica; returns per group its rows' `(new tokens int32 [max_new_tokens], generated
        length)`."""
        width = step[0].width
        requests = [self._request(table, group, width) for group in step]
        step_function, is_new = self._step_function(requests[0])
        inputs = self.strategy.experimental_distribute_values_from_function(
            lambda context: requests[context.replica_id_in_sync_group].inputs
        )
        guard = self.around_compile() if is_new else contextlib.nullcontext()
        with guard, announce_compile(requests[0], is_new, what=f"generate on {self.replicas} replica(s)"):
            try:
                outputs = step_function(inputs)
            except tf.errors.OpError as error:
                # A program the compile cache gave that TensorFlow could not use: the cache deletes its entries,
                # and the step runs on programs traced anew (programs.HealingProgram).
                if not (is_new and compile_cache.heal(error)):
                    raise
                del self._step_functions[requests[0].spec]
                generate_program(self.model, requests[0])[0].renew()
                step_function, _ = self._step_function(requests[0])
                outputs = step_function(inputs)
            new_tokens, lengths = (tensor.numpy() for tensor in outputs)
        # Strategies that return several rows per prompt (beams) put the chosen one first.
        rows_per_prompt = len(new_tokens) // self.replicas // requests[0].spec.batch_size
        results = []
        per_replica = zip(step, np.split(new_tokens, self.replicas), np.split(lengths, self.replicas))
        for group, tokens, group_lengths in per_replica:
            chosen = slice(0, len(group.rows) * rows_per_prompt if group is not None else 0, rows_per_prompt)
            results.append(list(zip(tokens[chosen, : self.max_new_tokens], group_lengths[chosen].tolist())))
        return results

    def _step_function(self, request: Request):
        """Returns `(step_function, is_new)`: a tf.function running the request's compiled program on every
        replica and gathering the new tokens `[replicas * rows, buffer_new_tokens]` and the generated lengths
        `[replicas * rows]`; one per program, i.e. per
        `request.spec` (TPUStrategy.run must be called inside a tf.function)."""
        step_function = self._step_functions.get(request.spec)
        if step_function is not None:
            return step_function, False
        program, _ = generate_program(self.model, request)
        strategy, new_columns = self.strategy, request.spec.buffer_new_tokens

        def replica_step(replica_inputs):
            result = program(replica_inputs)
            return result["sequences"][:, -new_columns:], result["generated_lengths"]

        def step(inputs):
            # A function, not `program` itself: MirroredStrategy.run hands a tf.function its PerReplica values unsplit.
            return tuple(strategy.gather(values, axis=0) for values in strategy.run(replica_step, args=(inputs,)))

        step_function = self._step_functions[request.spec] = tf.function(step)
        return step_function, True
