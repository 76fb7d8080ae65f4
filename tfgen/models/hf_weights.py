"""HF checkpoints and tfgen's Keras models: which part of which variable each HF tensor fills (`HFPart`, recorded by
`HFWeights` as a layer creates its weights), checking a checkpoint's names and shapes against them, assigning it
(transposing and fusing) and writing it back in HF's layout (`save_pretrained`). Shared by GPT-2, the Llama family and
T5."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import keras
import numpy as np
import safetensors.numpy
import tensorflow as tf

from tfgen.models.quantize import QuantizedArray, QuantizedKernel, quantize_rows
from tfgen.models.quantize_modes import check_quantize

# True while `weights_follow()` is active: a model built then gets its weights from a checkpoint.
_LOADING = [False]


@contextlib.contextmanager
def weights_follow():
    """While active, `HFWeights` allocates the weights it would draw at random without filling them: a model built
    from a checkpoint has every one of them assigned next (`select_hf_tensors` refuses a checkpoint missing any), and
    drawing SmolLM2's ~135M normal values took 1.2 s of its load (filling zeros, 0.5 s)."""
    previous, _LOADING[0] = _LOADING[0], True
    try:
        yield
    finally:
        _LOADING[0] = previous


def _unfilled(shape, dtype=None):
    """An initializer allocating without filling (`weights_follow`: the checkpoint fills the weight next)."""
    return tf.raw_ops.Empty(shape=shape, dtype=tf.as_dtype(dtype or "float32"), init=False)


class HFPart(NamedTuple):
    """Where one HF tensor lives: `variable`, its `columns` (a slice of the last axis; None = all of it), whether
    HF stores it transposed (`[out, in]` against our `[in, out]`), and its HF shape."""

    variable: Any
    columns: slice | None
    transposed: bool
    hf_shape: tuple


class HFWeights:
    """Creates a Keras layer's weights (normal initialisation: each `stddev` below times `stddev_scale`; norms at one)
    and records in `parts`, per HF tensor name (`hf_prefix` + name), which part of which variable it fills.

    Kernels are stored `[in, out]` and HF's `Linear` layers of one module fused side by side into one kernel (q/k/v,
    gate/up); an embedding may be stored transposed (`[dim, vocab]`, so that the LM head is an `x @ W`).

    With `quantize="int8"` the kernels (and the matrices made with `quantizable=True`: embeddings, LM heads) are
    `tfgen.models.quantize.QuantizedKernel`s, an int8 variable and a float32 scale per HF row (output channel)."""

    def __init__(self, layer: keras.layers.Layer, hf_prefix: str = "", *, stddev_scale: float = 1.0,
                 quantize: str | None = None):
        self.layer, self.hf_prefix, self.stddev_scale = layer, hf_prefix, stddev_scale
        self.quantize = check_quantize(quantize)
        self.parts: dict[str, HFPart] = {}

    def _add(self, name: str, shape, initializer):
        # No Keras autocast: the models cast explicitly, so `call` and `call_with_cache` compute alike.
        return self.layer.add_weight(shape=shape, initializer=initializer, name=name.replace(".", "_"),
                                     autocast=False)

    def _add_quantized(self, name: str, shape, channel_axis: int) -> QuantizedKernel:
        """An int8 `shape` weight with a float32 scale per slice along `channel_axis` (filled by the checkpoint;
        zeros otherwise: a quantized model is always loaded from one)."""
        initializer = _unfilled if _LOADING[0] else "zeros"
        values = self.layer.add_weight(shape=shape, initializer=initializer, name=name.replace(".", "_"),
                                       dtype="int8", trainable=False, autocast=False)
        scale = self.layer.add_weight(shape=(shape[channel_axis],), initializer=keras.initializers.Constant(0.01),
                                      name=f"{name.replace('.', '_')}_scale", trainable=False, autocast=False)
        return QuantizedKernel(values, scale, channel_axis)

    def _normal(self, stddev: float):
        if _LOADING[0]:
            return _unfilled
        return keras.initializers.RandomNormal(stddev=self.stddev_scale * stddev)

    def norm(self, hf_name: str, dim: int):
        """A `[dim]` norm weight, initialised to one."""
        variable = self._add(hf_name, (dim,), "ones")
        self.parts[self.hf_prefix + hf_name] = HFPart(variable, None, False, (dim,))
        return variable

    def matrix(self, hf_name: str, hf_shape: tuple[int, int], *, transposed: bool, stddev: float = 1.0,
               quantizable: bool = False):
        """HF's `[rows, columns]` matrix (an embedding, a bias table), stored as is or (`transposed`) as
        `[columns, rows]`; int8 with a scale per HF row when the factory quantizes and it is `quantizable`."""
        shape = tuple(reversed(hf_shape)) if transposed else tuple(hf_shape)
        if self.quantize and quantizable:
            variable = self._add_quantized(hf_name, shape, -1 if transposed else 0)
        else:
            variable = self._add(hf_name, shape, self._normal(stddev))
        self.parts[self.hf_prefix + hf_name] = HFPart(variable, None, transposed, tuple(hf_shape))
        return variable

    def linear(self, module: str, projections: tuple[str, ...], n_in: int, widths: tuple[int, ...], *,
               bias: bool = False, stddevs: tuple[float, ...] = (1.0,)):
        """`(kernel [n_in, sum(widths)], bias [sum(widths)] or None)` standing for HF's `Linear` layers
        `module.projection` (weights `[width, n_in]`), side by side in that order. `stddevs`: one deviation for
        every projection, or one per projection (HF draws some with their own, as T5's q)."""
        name = f"{module}.{'_'.join(projections)}"
        if len(set(stddevs)) == 1:
            initializer = self._normal(stddevs[0])
        else:
            def initializer(shape, dtype=None):
                draws = [self._normal(stddev)((n_in, width), dtype) for stddev, width in zip(stddevs, widths)]
                return keras.ops.concatenate(draws, axis=-1)
        if self.quantize:
            kernel = self._add_quantized(f"{name}_kernel", (n_in, sum(widths)), -1)
        else:
            kernel = self._add(f"{name}_kernel", (n_in, sum(widths)), initializer)
        bias_variable = self._add(f"{name}_bias", (sum(widths),), "zeros") if bias else None
        start = 0
        for projection, width in zip(projections, widths):
            columns, hf_name = slice(start, start + width), f"{self.hf_prefix}{module}.{projection}"
            self.parts[f"{hf_name}.weight"] = HFPart(kernel, columns, True, (width, n_in))
            if bias:
                self.parts[f"{hf_name}.bias"] = HFPart(bias_variable, columns, False, (width,))
            start += width
        return kernel, bias_variable


def select_hf_tensors(
    tensors: Mapping[str, np.ndarray],
    expected: Mapping[str, tuple],
    model_name: str,
    *,
    optional: Mapping[str, tuple] | None = None,
    rename: Callable[[str], str] = lambda name: name,
    ignored: Callable[[str], bool] = lambda name: False,
) -> dict[str, np.ndarray]:
    """The checkpoint's tensors by (renamed) HF name, once every name of `expected` (name -> shape) is there with
    its shape. Names of `optional` are shape-checked and dropped (a tied head's copy); `ignored` names (buffers) are
    dropped. Otherwise a ValueError lists every missing, unexpected and mis-shaped tensor (nothing is assigned)."""
    optional = optional or {}
    provided, unexpected, mismatched = {}, [], {}
    for name, array in tensors.items():
        short_name = rename(name)
        if ignored(short_name):
            continue
        shape = expected.get(short_name, optional.get(short_name))
        if shape is None:
            unexpected.append(name)
        elif tuple(array.shape) != tuple(shape):
            mismatched[short_name] = f"{name}: checkpoint {tuple(array.shape)} vs model {tuple(shape)}"
        elif short_name in expected:
            provided[short_name] = array
    missing = sorted(set(expected) - set(provided) - set(mismatched))
    if missing or unexpected or mismatched:
        raise ValueError(
            f"checkpoint does not match {model_name}: "
            f"missing={missing}, unexpected={sorted(unexpected)}, shape_mismatch={list(mismatched.values())}"
        )
    return provided


def assign_hf_parts(parts: Mapping[str, HFPart], provided: Mapping[str, np.ndarray]) -> None:
    """Assigns each checked HF tensor of `provided` (what `select_hf_tensors` returns) to its part of `parts`:
    transposed where HF stores `[out, in]`, the parts of one fused variable concatenated in column order, cast to
    the variable's dtype (bfloat16 -> float32 is exact)."""
    pieces: dict[int, list] = {}
    for name, array in provided.items():
        part = parts[name]
        pieces.setdefault(id(part.variable), []).append((part, array))
    for variable_pieces in pieces.values():
        variable = variable_pieces[0][0].variable
        variable_pieces.sort(key=lambda piece: 0 if piece[0].columns is None else piece[0].columns.start)
        if isinstance(variable, QuantizedKernel):
            _assign_quantized(variable, variable_pieces)
            continue
        values = [tf.cast(tf.convert_to_tensor(array), variable.dtype) for _, array in variable_pieces]
        values = [tf.transpose(value) if part.transposed else value
                  for (part, _), value in zip(variable_pieces, values)]
        variable.assign(values[0] if len(values) == 1 else tf.concat(values, axis=-1))


def _assign_quantized(kernel: QuantizedKernel, pieces: list) -> None:
    """Assigns a quantized kernel from its HF pieces (float arrays, or `QuantizedArray`s already quantized per HF
    row): each quantized per HF row, which is per output channel whether or not the rows are fused side by side."""
    values, scales = [], []
    for part, array in pieces:
        quantized = array if isinstance(array, QuantizedArray) else quantize_rows(array)
        values.append(quantized.values.T if part.transposed else quantized.values)
        scales.append(quantized.scale)
    kernel.values.assign(values[0] if len(values) == 1 else np.concatenate(values, axis=-1))
    kernel.scale.assign(np.concatenate(scales))


def hf_part_arrays(parts: Mapping[str, HFPart]) -> dict[str, np.ndarray]:
    """Every part of `parts` as a numpy array under its HF name, in HF's layout (fused variables split again)."""
    arrays = {}
    for name, part in parts.items():
        variable = part.variable
        value = variable.numpy() if isinstance(variable, QuantizedKernel) else keras.ops.convert_to_numpy(variable)
        value = value if part.columns is None else value[..., part.columns]
        arrays[name] = np.ascontiguousarray(value.T if part.transposed else value)
    return arrays


def save_hf_checkpoint(model, directory: str | os.PathLike) -> None:
    """Writes `model`'s `config.json` (its config's `to_dict()` plus `torch_dtype`) and `model.safetensors`
    (`model.hf_state_dict()`), plus `generation_config.json` when `model.generation_config` is set: what HF's
    `from_pretrained` of the same architecture loads."""
    os.makedirs(directory, exist_ok=True)
    dtype = keras.backend.standardize_dtype(model.dtype_policy.variable_dtype)
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as file:
        json.dump({**model.config.to_dict(), "torch_dtype": dtype}, file, indent=2, sort_keys=True)
    safetensors.numpy.save_file(
        model.hf_state_dict(), os.path.join(directory, "model.safetensors"), metadata={"format": "pt"}
    )
    if model.generation_config is not None:
        model.generation_config.save_pretrained(directory)
