"""What can be checked here of TPU readiness is checked: every XLA program tfgen builds for `tfgen batch` (the
generate program of each strategy batch jobs run: greedy, sampling with its warpers, beam search) and for an export
(every `jit_compile` function of the signatures, and of the slot signatures) is lowered to HLO with
`experimental_get_compiler_ir(...)(stage="hlo")` and walked: it must have static shapes only and no op a TPU lacks.

Refused: a bounded-dynamic (`<=N`) or unknown (`?`) dimension in any shape; a `set-dimension-size` whose size is
not a constant equal to the dimension (TF's TopKV2 lowering emits ones with a constant full size: static); host
transfers (`send`, `recv`, `outfeed`, `infeed`, host compute); any `custom-call` (host callbacks, Python functions);
and a program XLA cannot lower at all, which is how a `tf.py_function` / `EagerPyFunc` or a string op inside a
compiled function shows (the negative checks below prove the walker catches both). The op sets are printed.

Tiny model, batch 2, prompt 8, 4 new tokens: lowering to HLO traces but does not compile, a few seconds each.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
import tensorflow as tf

from tfgen.export import export_saved_model
from tfgen.generation.programs import generate_program
from tfgen.request.prepare import prepare_request

BATCH, WIDTH, NEW = 2, 8, 4
# What batch jobs run (`tfgen batch` with these options resolves the same call; `BatchRunner` prepares each group
# with `prepare_request` and runs `generate_program`): greedy, sampling with every warper, beam search.
BATCH_STRATEGIES = {
    "greedy": {},
    "sampling": dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9),
    "beam": dict(num_beams=2),
}
# Ops that move data to or from the host inside a program, which a TPU program cannot hold.
HOST_OPS = {"send", "send-done", "recv", "recv-done", "outfeed", "infeed", "custom-call", "host-compute"}
INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.*?) ([a-z][a-z0-9\-]*)\((.*)$")
DYNAMIC_DIMENSION = re.compile(r"\[[^\]]*(?:<=|\?)[^\]]*\]")


def hlo_of(function, *args) -> str:
    """The HLO text of `function` (a `tf.function(jit_compile=True)`) for `args`; a program XLA cannot lower raises
    AssertionError naming what it found (unsupported ops, such as EagerPyFunc or string ops)."""
    try:
        return function.experimental_get_compiler_ir(*args)(stage="hlo")
    except (tf.errors.OpError, ValueError, TypeError) as error:
        raise AssertionError(f"not lowerable to XLA (no TPU program): {error}") from error


def tpu_problems(hlo: str) -> tuple[set[str], list[str]]:
    """(the op set, the problems: dynamic shapes and host ops) of an HLO module's text."""
    instructions = {}
    for line in hlo.splitlines():
        match = INSTRUCTION.match(line)
        if match:
            instructions[match.group(1)] = match.groups()[1:]
    problems, ops = [], set()
    for name, (shape, op, rest) in instructions.items():
        ops.add(op)
        if DYNAMIC_DIMENSION.search(shape):
            problems.append(f"dynamic shape {shape} in {name} ({op})")
        if op in HOST_OPS or op.startswith("host"):
            problems.append(f"host op {op} in {name}: {rest[:200]}")
        if op == "set-dimension-size":
            problems += _dynamic_size(name, shape, rest, instructions)
    return ops, problems


def _dynamic_size(name, shape, rest, instructions) -> list[str]:
    """[] when the set-dimension-size sets its dimension to a constant equal to its static size, else the problem."""
    operands = re.findall(r"%([\w.\-]+)", rest.split(")")[0])
    dimension = int(re.search(r"dimensions=\{(\d+)\}", rest).group(1))
    static = int(re.match(r"\w+\[([^\]]*)\]", shape).group(1).split(",")[dimension].lstrip("<="))
    size = instructions.get(operands[-1]) if operands else None
    constant = re.match(r"(-?\d+)\)", size[2]) if size is not None and size[1] == "constant" else None
    if constant is None or int(constant.group(1)) != static:
        return [f"dynamic size in {name}: set-dimension-size to {operands[-1:]} of a {static}-wide dimension"]
    return []


def assert_tpu_ready(hlo: str, what: str) -> set[str]:
    ops, problems = tpu_problems(hlo)
    assert not problems, f"{what}: not a static, host-free program:\n" + "\n".join(problems[:20])
    print(f"{what}: {len(ops)} ops: {', '.join(sorted(ops))}")
    return ops


def prompts() -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([[0] * 3 + [5, 6, 7, 8, 9], [10 + i for i in range(WIDTH)]], np.int32)
    return ids, (ids > 0).astype(np.int32)


@pytest.mark.parametrize("strategy", list(BATCH_STRATEGIES))
def test_batch_generate_programs_are_static_and_host_free(tiny_model, strategy):
    options = BATCH_STRATEGIES[strategy]
    ids, mask = prompts()
    seed = np.array([[1, 2], [3, 4]], np.int32) if options.get("do_sample") else None
    request = prepare_request(tiny_model, ids, attention_mask=mask, seed=seed, max_new_tokens=NEW, **options)
    program, _ = generate_program(tiny_model, request)
    ops = assert_tpu_ready(hlo_of(program.function, request.inputs), f"batch {strategy}")
    assert "while" in ops  # the whole loop is in the program, not stepped from the host


@pytest.fixture(scope="module")
def export_functions(tiny_model, tmp_path_factory, monkeypatch_module):
    """{name: (jit function, input specs)}: every `tf.function(jit_compile=True)` an export of the greedy, sample and
    beam_search signatures (and the slot signatures, where the model has them) creates, with the inputs it was
    traced with (batch and prompt length left open: None)."""
    functions = {}
    make_function = tf.function

    def recording(function=None, **options):
        if function is None or not options.get("jit_compile"):
            return make_function(function, **options) if function is not None else make_function(**options)
        traced = []

        @functools.wraps(function)
        def capturing(*args):
            traced.append(tf.nest.map_structure(lambda x: tf.TensorSpec(x.shape, x.dtype) if tf.is_tensor(x) else x,
                                                args))
            return function(*args)

        compiled = make_function(capturing, **options)
        functions[f"{len(functions)}:{getattr(function, '__name__', 'function')}"] = (compiled, traced)
        return compiled

    monkeypatch_module.setattr(tf, "function", recording)
    export_saved_model(tiny_model, tmp_path_factory.mktemp("tpu_export"), max_new_tokens=NEW,
                       signatures=["greedy", "sample", "beam_search"], num_beams=2)
    monkeypatch_module.undo()
    assert functions
    return functions


@pytest.fixture(scope="module")
def monkeypatch_module():
    patch = pytest.MonkeyPatch()
    yield patch
    patch.undo()


def concrete(spec, batch: int = BATCH, width: int = WIDTH):
    """A zero tensor for a traced input spec: the open batch dimension (the first) `batch`, other open ones `width`."""
    if not isinstance(spec, tf.TensorSpec):
        return spec
    shape = [(batch if index == 0 else width) if size is None else size for index, size in enumerate(spec.shape)]
    return tf.zeros(shape, spec.dtype)


def test_export_programs_are_static_and_host_free(export_functions):
    seen = set()
    for name, (function, traced) in export_functions.items():
        assert traced, f"{name} was never traced"
        args = tf.nest.map_structure(concrete, traced[0])
        seen |= assert_tpu_ready(hlo_of(function, *args), f"export {name}")
    assert "while" in seen


def test_the_walker_finds_host_callbacks_string_ops_and_dynamic_shapes():
    @tf.function(jit_compile=True)
    def with_python(x):
        return tf.py_function(lambda y: y + 1, [x], tf.float32) * 2

    with pytest.raises(AssertionError, match="EagerPyFunc"):
        hlo_of(with_python, tf.ones([2]))

    @tf.function(jit_compile=True)
    def with_strings(x):
        return tf.strings.length(tf.strings.as_string(x))

    with pytest.raises(AssertionError, match="not lowerable"):
        hlo_of(with_strings, tf.ones([2]))

    dynamic = ("HloModule m\n\nENTRY %main (p: f32[8]) -> f32[<=8] {\n  %p = f32[8]{0} parameter(0)\n"
               "  %n = s32[] parameter(1)\n  ROOT %d = f32[<=8]{0} set-dimension-size(f32[8]{0} %p, s32[] %n), "
               "dimensions={0}\n}\n")
    _, problems = tpu_problems(dynamic)
    assert any("dynamic shape f32[<=8]" in problem for problem in problems)
    assert any("dynamic size in d" in problem for problem in problems)
    _, problems = tpu_problems("  %h = (f32[2], u32[]) send(f32[2]{0} %x, token[] %t), channel_id=1\n"
                               "  %c = f32[2]{0} custom-call(f32[2]{0} %x), custom_call_target=\"callback\"\n")
    assert sorted(problem.split(" in ")[0] for problem in problems) == ["host op custom-call", "host op send"]
