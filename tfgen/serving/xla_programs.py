"""Dropping the XLA programs TensorFlow compiled in this process, so that an unloaded version's programs do not stay.

TensorFlow keeps every program that a `jit_compile` function compiled in a cache per device (a `DeviceCompiler`
in the device's resource manager, `localhost/xla_device_compiler`), keyed by the function's name and argument
shapes, and never evicts an entry. Each SavedModel load gives the restored functions new names, so every version
of an XLA export that `tfgen serve` loads and runs adds its programs (and their compilation records) for good:
~15–20 MB per load / unload cycle of a tiny GPT-2 export with 1024 positions, unbounded over a server's life.

TensorFlow has no call that evicts them, but the cache is a reference-counted resource: `DestroyResourceOp` on a
handle naming it (its device, container, name and the hash of its C++ type, `tsl::Hash64` of the type's
`typeid` name) takes it out of the resource manager, and it is freed once the programs running now (which hold
a reference) end. The next `jit_compile` call creates an empty cache and compiles again (from the persistent
compilation cache when it is on, `tfgen.generation.compile_cache`). So `drop_compiled_programs()` drops every
program — the served versions' too, which `ServedModels` then warms again.

The names are TensorFlow's internals (`tensorflow/compiler/jit/xla_platform_info.cc`, checked on TensorFlow
2.21): when a later TensorFlow renames them, nothing is found, `drop_compiled_programs()` returns 0 and logs it
once, and the memory test (`tests/test_serve_hostile.py`) fails.
"""

from __future__ import annotations

import logging

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, resource_handle_pb2, tensor_pb2, types_pb2
from tensorflow.python.eager import context

logger = logging.getLogger(__name__)

# (resource name, mangled C++ type name) of the per-device resources holding compiled programs and their records.
_RESOURCES = (
    ("xla_device_compiler", "N10tensorflow14DeviceCompilerIN3xla15LocalExecutableENS1_11LocalClientEEE"),
    ("device_compilation_profiler", "N10tensorflow25DeviceCompilationProfilerE"),
)
_CONTAINER = "localhost"  # a device resource manager's default container
_MASK = 2**64 - 1
_warned = False
_DESTROY: dict = {}  # (device, resource name) -> its tf.function


def type_hash(name: str) -> int:
    """`tsl::Hash64(name)` (MurmurHash64A with TensorFlow's seed), which `TypeIndex::Make<T>` uses as the hash of a
    resource's C++ type (`typeid(T).name()`)."""
    data, multiplier = name.encode(), 0xC6A4A7935BD1E995
    value = (0xDECAFCAFFE ^ (len(data) * multiplier)) & _MASK
    whole = len(data) - len(data) % 8
    for start in range(0, whole, 8):
        word = int.from_bytes(data[start:start + 8], "little") * multiplier & _MASK
        word = (word ^ word >> 47) * multiplier & _MASK
        value = (value ^ word) * multiplier & _MASK
    if whole < len(data):
        value = (value ^ int.from_bytes(data[whole:], "little")) * multiplier & _MASK
    value = (value ^ value >> 47) * multiplier & _MASK
    return value ^ value >> 47


def _handle(device: str, name: str, type_name: str) -> tf.Tensor:
    """A resource handle naming `name` of C++ type `type_name` on `device` (a `Const` of dtype resource, inside a
    tf.function's graph)."""
    proto = resource_handle_pb2.ResourceHandleProto(device=device, container=_CONTAINER, name=name,
                                                    hash_code=type_hash(type_name), maybe_type_name=type_name)
    value = tensor_pb2.TensorProto(dtype=types_pb2.DT_RESOURCE, resource_handle_val=[proto])
    value.tensor_shape.SetInParent()  # a scalar
    graph = tf.compat.v1.get_default_graph()
    return graph.create_op("Const", [], [tf.resource], attrs={
        "value": attr_value_pb2.AttrValue(tensor=value),
        "dtype": attr_value_pb2.AttrValue(type=types_pb2.DT_RESOURCE)}).outputs[0]


def _drop(device: str, name: str, type_name: str) -> bool:
    """Destroys resource `name` of C++ type `type_name` on `device`; False when there is none."""
    key = (device, name)
    if key not in _DESTROY:  # one function per resource (a new one per call would be traced again each time)
        @tf.function(autograph=False)
        def destroy():
            with tf.device(device):
                tf.raw_ops.DestroyResourceOp(resource=_handle(device, name, type_name), ignore_lookup_error=False)

        _DESTROY[key] = destroy
    try:
        _DESTROY[key]()
    except tf.errors.NotFoundError:
        return False  # nothing compiled on this device since the last drop (or TensorFlow renamed it)
    return True


def drop_compiled_programs() -> int:
    """Takes every device's XLA program cache out of TensorFlow's reach (freed once the programs running now end);
    later `jit_compile` calls compile again. Returns how many caches were dropped (0 when no program was compiled
    since the last drop)."""
    global _warned
    dropped = 0
    context.ensure_initialized()
    for device in context.context().devices():  # full names: a handle's device must match its kernel's
        if _drop(device, *_RESOURCES[0]):
            dropped += 1
            _drop(device, *_RESOURCES[1])
    if not dropped and not _warned:
        _warned = True
        logger.debug("no XLA program cache found to drop (nothing compiled yet, or TensorFlow %s renamed it)",
                     tf.__version__)
    return dropped
