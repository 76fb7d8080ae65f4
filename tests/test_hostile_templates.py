"""Hostile chat templates (a GGUF file's or a checkpoint's untrusted Jinja) end fast in one ValueError naming where
the template comes from and the limit it went past: the step budget, the size bound (checked before a value is built)
and recursion (tfgen/text/template_limits.py). The issue's cases run at full scale in a subprocess with capped memory;
the other amplifiers run against a small bound. Templates within the limits render as the plain sandbox does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import chat_templates
import gguf
import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tfgen.cli import main
from tfgen.text import chat_template, template_limits
from tfgen.text.chat_template import compile_chat_template, render_chat

TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}
USER = [{"role": "user", "content": "What is the capital of France?"}]
# The issue's cases, at the scale it reported them.
ISSUE_CASES = {
    "nested_range_loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "string_times_1e10": "{{ 'a' * 10**10 }}",
    "messages_times_1e9": "{{ (messages * 10**9)|length }}",
    "tojson_indent_1e9": "{{ messages|tojson(indent=10**9) }}",
    "namespace_doubled_60_times": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
                                  "{% endfor %}{{ ns.s|length }}",
    "namespace_added_60_times": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
                                "{% endfor %}{{ ns.s|length }}",
    "lipsum_1e7": "{{ lipsum(10**7) }}",
    "500_MB_prompt": "{% for i in range(100000) %}{{ messages[0].content * 150 }}{% endfor %}",
    "recursive_macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "3000_nested_ifs": "{% if true %}" * 3000 + "x" + "{% endif %}" * 3000,
    "recursive_loop": "{% for x in range(100000) recursive %}{{ loop(range(100000)) }}{% endfor %}",
}
REASONS = {
    "nested_range_loops": f"more than {template_limits.MAX_RENDER_STEPS} steps",
    "recursive_macro": "recursed too deeply",
    "3000_nested_ifs": "nests too deeply to compile", "recursive_loop": "recursed too deeply",
}
_RUN_CASES = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # today's renderer asked for 10 GB and more
from tfgen.text.chat_template import render_chat
results = {}
for name, source in json.loads(sys.argv[1]).items():
    start = time.perf_counter()
    try:
        render_chat(source, [{"role": "user", "content": "What is the capital of France?"}], origin="hostile.gguf")
        outcome = "rendered"
    except Exception as error:
        outcome = f"{type(error).__name__}: {error}"
    results[name] = [outcome, time.perf_counter() - start]
print(json.dumps(results))
"""


@pytest.fixture
def small_bound(monkeypatch):
    """A size bound of 1000 characters and 1000 steps, so amplifiers are refused at a scale today's code renders."""
    monkeypatch.setattr(template_limits, "MIN_RENDER_BYTES", 1000)
    monkeypatch.setattr(template_limits, "ASSUMED_CONTEXT_TOKENS", 10)
    monkeypatch.setattr(template_limits, "MAX_RENDER_STEPS", 1000)
    compile_chat_template.cache_clear()  # constants folded under another bound
    yield 1000
    compile_chat_template.cache_clear()


def test_the_issue_cases_are_refused_fast_at_full_scale():
    done = subprocess.run([sys.executable, "-c", _RUN_CASES, json.dumps(ISSUE_CASES)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.splitlines()[-1])
    for name, (outcome, seconds) in results.items():
        assert outcome.startswith("ValueError: the chat template (hostile.gguf) "), (name, outcome)
        assert REASONS.get(name, "(the size bound, max(1048576, an assumed 131072-token context x 64) = 8388608 "
                                 "characters)") in outcome, (name, outcome)
        assert "\n" not in outcome and seconds < 2.0, (name, outcome, seconds)


def test_the_bound_follows_the_context_with_a_floor():
    assert template_limits.render_limit(None) == 131_072 * 64 == 8 << 20
    assert template_limits.render_limit(2048) == 1 << 20  # the floor
    assert template_limits.render_limit(1 << 20) == 64 << 20
    template = "{{ messages[0].content }}"
    text = "x" * (1 << 20)
    assert render_chat(template, [{"role": "user", "content": text}], context_tokens=2048) == text
    with pytest.raises(ValueError, match=r"\(chat_template=\) rendered 1048577 characters, over the size bound, "
                                         r"max\(1048576, 2048-token context x 64\) = 1048576 characters"):
        render_chat(template, [{"role": "user", "content": text + "x"}], context_tokens=2048)


def _plain_render(source: str, **names) -> str:
    """The renderer before the limits (HF's setup): the immutable sandbox alone."""
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[chat_template.GenerationBlock, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = chat_template._tojson  # noqa: SLF001 (the same filter, to compare the rest)
    return environment.from_string(source).render(**names)


# Templates that use every hook (loops, recursive loops, `~`, `+`, `*`, `%`, format, the checked filters) within the
# limits: the text is the plain sandbox's, byte for byte, until one more step or character goes past a limit.
WITHIN_LIMITS = {
    "published": chat_templates.QWEN2_5 + chat_templates.NAMESPACE + chat_templates.LLAMA3,
    "hooks": textwrap.dedent("""\
        {% for m in messages if m.role %}{{ loop.index }}/{{ loop.length }}{{ m.role ~ ':' ~ m.content }}{% endfor %}
        {% for x in [[1, [2]], [3]] recursive %}({{ x if x is number else loop(x) }}){% endfor %}
        {{ '%-5s|%3d' % ('ab', 7) }}{{ '{:>6}'.format('r') }}{{ 'ab' * 3 + 'c' }}{{ 2 ** 10 }}{{ [1, 2] * 2 }}
        {{ 'a b'|center(9) }}{{ 'x\\ny'|indent(2, true) }}{{ [1, 2, 3]|batch(2, 0)|list }}{{ [1, 2, 3]|slice(2)|list }}
        {{ 'aXa'|replace('a', 'bb') }}{{ ['p', 'q']|join('-') }}{{ '%s!'|format('hi') }}{{ [[1], [2]]|sum(start=[]) }}
        {{ 'x'.ljust(4) ~ 'y'.zfill(3) ~ '\\t'.expandtabs(2) ~ ','.join(['1', '2']) }}{{ messages|tojson(indent=2) }}
        {% set ns = namespace(s='') %}{% for i in range(3) %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.s }}"""),
}


@pytest.mark.parametrize("name", WITHIN_LIMITS)
def test_within_the_limits_the_text_is_the_plain_sandboxs(name, small_bound, monkeypatch):
    source = WITHIN_LIMITS[name]
    expected = _plain_render(source, messages=USER, tools=None, documents=None, add_generation_prompt=True, **TOKENS)
    assert len(expected) > 200
    # Bounds just large enough: the same text, byte for byte.
    monkeypatch.setattr(template_limits, "MIN_RENDER_BYTES", 100_000)
    assert render_chat(source, USER, add_generation_prompt=True, variables=TOKENS) == expected
    # The step count this render takes, found by lowering the budget until it is refused.
    steps = _steps_taken(source, monkeypatch)
    monkeypatch.setattr(template_limits, "MAX_RENDER_STEPS", steps)
    assert render_chat(source, USER, add_generation_prompt=True, variables=TOKENS) == expected
    monkeypatch.setattr(template_limits, "MAX_RENDER_STEPS", steps - 1)
    with pytest.raises(ValueError, match=f"more than {steps - 1} steps"):
        render_chat(source, USER, add_generation_prompt=True, variables=TOKENS)


def _steps_taken(source: str, monkeypatch) -> int:
    low, high = 1, 10_000
    while low < high:
        middle = (low + high) // 2
        monkeypatch.setattr(template_limits, "MAX_RENDER_STEPS", middle)
        try:
            render_chat(source, USER, add_generation_prompt=True, variables=TOKENS)
            high = middle
        except ValueError:
            low = middle + 1
    return low


@pytest.mark.parametrize("source", [
    "{% for i in range(1001) %}{% endfor %}",
    "{% for i in range(40) %}{% for j in range(40) %}{% endfor %}{% endfor %}",
    "{% for x in [range(600)] recursive %}{% if x is iterable %}{{ loop(x) }}{{ loop(x) }}{% endif %}{% endfor %}",
    "{% macro m() %}{% endmacro %}{% for i in range(600) %}{{ m() }}{% endfor %}",
    "{% for i in range(600) %}{{ messages[0].role|upper }}{% endfor %}",
], ids=["loop", "nested_loops", "recursive_loop", "macro_calls", "filter_calls"])
def test_the_step_budget_counts_iterations_and_calls(source, small_bound):
    with pytest.raises(ValueError, match="went past a render limit: it took more than 1000 steps"):
        render_chat(source, USER)


@pytest.mark.parametrize("expression", [
    "'a' * 2000", "[1] * 2000", "'a' * 1000 + 'b' * 1000", "'a' * 600 ~ 'b' * 600", "'%2000s' % 'x'",
    "'%*d' % (2000, 1)", "'{:>2000}'.format(1)", "'{:>{}}'.format(1, 2000)", "'{x:>2000}'.format_map({'x': 1})",
    "'a'|center(2000)", "('x\\n' * 100)|indent(20)", "[1]|batch(2000, 0)|list", "[1]|slice(2000)|list",
    "('a' * 100)|replace('a', 'b' * 30)", "('a' * 100).replace('a', 'b' * 30)", "(['x' * 100] * 20)|join",
    "'-'.join(['x' * 100] * 20)", "'%2000s'|format('x')", "'a'.ljust(2000)", "'a'.rjust(2000)", "'a'.zfill(2000)",
    "('\\t' * 100).expandtabs(30)", "(['x' * 100] * 20)|string", "(['x' * 100] * 20)|pprint",
    "([['x'] * 100] * 100)|sum(start=[])", "lipsum(20)", "strftime_now('%c' * 100)", "['x' * 100] * 20",
    "messages|tojson(indent=2000)", "2 ** 100000", "(2 ** 40000) * (2 ** 40000)",
])
def test_amplifiers_are_refused_before_they_build(expression, small_bound):
    with pytest.raises(ValueError, match=r"went past a render limit: .*(would be \d+ characters long|bits)"):
        render_chat("{{ " + expression + " }}", USER)


def test_output_produced_in_blocks_and_macros_counts(small_bound):
    # Each piece is within the bound; together (discarded in a block, or returned by a macro) they are not.
    for source in ("{% set big %}{% for i in range(200) %}{{ 'x' * 500 }}{% endfor %}{% endset %}",
                   "{% macro m() %}{% for i in range(200) %}0123456789{% endfor %}{% endmacro %}"
                   "{% for i in range(10) %}{% set x = m() %}{% endfor %}"):
        with pytest.raises(ValueError, match="produced more than 16 times the size bound"):
            render_chat(source, USER)


def test_a_render_past_its_time_is_stopped(small_bound, monkeypatch):
    # Few steps, each scanning a large message: the time backstop ends it.
    monkeypatch.setattr(template_limits, "MAX_RENDER_SECONDS", 0.01)
    monkeypatch.setattr(template_limits, "MIN_RENDER_BYTES", 4 << 20)
    source = "{% for i in range(900) %}{% if 'zz' in messages[0].content %}!{% endif %}{% endfor %}"
    with pytest.raises(ValueError, match="went past a render limit: it ran for more than 0.01 seconds"):
        render_chat(source, [{"role": "user", "content": "x" * (2 << 20)}])


@pytest.fixture
def hostile_dir(model_dir, tmp_path):
    directory = tmp_path / "hostile"
    shutil.copytree(model_dir, directory)
    return directory


def test_the_source_and_context_are_named(hostile_dir, tmp_path):
    from gguf_files import build_hf_model, byte_level_vocabulary, write_gguf

    from tfgen import AutoTokenizer, Tokenizer

    hostile = ISSUE_CASES["string_times_1e10"]
    config_path = hostile_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": hostile}))
    tokenizer = Tokenizer.from_pretrained(hostile_dir)
    # GPT-2's name for it
    assert tokenizer.context_length == json.loads((hostile_dir / "config.json").read_text())["n_positions"]
    with pytest.raises(ValueError, match=f"the chat template \\({config_path} chat_template\\) went past"):
        tokenizer.apply_chat_template(USER)
    (hostile_dir / "chat_template.jinja").write_text(hostile)
    with pytest.raises(ValueError, match=f"the chat template \\({hostile_dir / 'chat_template.jinja'}\\) went past"):
        Tokenizer.from_pretrained(hostile_dir).apply_chat_template(USER)
    with pytest.raises(ValueError, match="the chat template \\(chat_template=\\) went past"):
        tokenizer.apply_chat_template(USER, chat_template=hostile)
    tokenizer.chat_template = hostile
    with pytest.raises(ValueError, match="the chat template \\(tokenizer.chat_template\\) went past"):
        tokenizer.apply_chat_template(USER)
    model = build_hf_model("llama", len(byte_level_vocabulary()[0]), hidden_size=32, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                           max_position_embeddings=50_000)
    path = write_gguf(tmp_path / "m.gguf", model, arch="llama",
                      metadata={"tokenizer.chat_template": (hostile, gguf.GGUFValueType.STRING)})
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.context_length == 50_000
    with pytest.raises(ValueError, match=f"\\({path} GGUF metadata tokenizer.chat_template\\) went past .*"
                                         "50000-token context x 64\\) = 3200000 characters"):
        tokenizer.apply_chat_template(USER)


def test_the_cli_prints_one_line_before_tokenizing(hostile_dir, capsys, monkeypatch):
    from tfgen.text.tokenizer_base import BaseTokenizer

    encoded = []
    monkeypatch.setattr(BaseTokenizer, "__call__", lambda self, *args, **options: encoded.append(args))
    for name in ("recursive_macro", "messages_times_1e9"):
        (hostile_dir / "chat_template.jinja").write_text(ISSUE_CASES[name])
        assert main(["generate", "--model", str(hostile_dir), "--chat", "w5 w6"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"tfgen: error: the chat template ({hostile_dir}") and \
            "Traceback" not in err
    assert encoded == []
