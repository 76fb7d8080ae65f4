"""`tf.distribute` for batch jobs: strategies by name (with detection), the workers' agreement on where a
resumed job starts, and a lost worker as one clear error."""

from __future__ import annotations

import contextlib
import json
import os

import tensorflow as tf

from tfgen.batch.options import DISTRIBUTION_STRATEGIES


def make_strategy(name: str = "auto", tpu: str = "local") -> tf.distribute.Strategy:
    """A `tf.distribute` strategy by name (one of `DISTRIBUTION_STRATEGIES`).

    "default": one device. "mirrored": every local GPU, or every logical CPU device when there is no GPU.
    "tpu": TPUStrategy on `tpu` ("local" on a TPU VM, else the TPU's name or grpc:// address).
    "multi-worker": MultiWorkerMirroredStrategy, configured by `TF_CONFIG`. "auto": multi-worker when
    `TF_CONFIG` lists several tasks, tpu when a TPU is visible or `TPU_NAME` is set, mirrored when there are
    several GPUs (or logical CPUs), else default.
    """
    if name not in DISTRIBUTION_STRATEGIES:
        raise ValueError(f"strategy must be one of {DISTRIBUTION_STRATEGIES}, got {name!r}")
    if name == "auto":
        name = _detect_strategy()
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([device.name for device in devices])
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    return tf.distribute.MultiWorkerMirroredStrategy()


class WorkerLost(ConnectionError):
    """A multi-worker job's collective failed because another worker died, hung or became unreachable (TensorFlow
    aborts the collectives of every worker when a peer's connection is reset or its heartbeats stop). Nothing
    more can be generated in this run; what the chief committed stays, and the job resumes when every worker is
    started again with the same arguments. The `tfgen` command prints the message and exits with status 1."""

    exit_status = 1


# The errors a collective raises when a peer is gone: connection reset or refused (Unavailable), heartbeats
# stopped (Unavailable), a peer restarted under the same address (FailedPrecondition), a deadline or abort.
_PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.DeadlineExceededError,
    tf.errors.FailedPreconditionError,
)


@contextlib.contextmanager
def peers_checked(strategy: tf.distribute.Strategy):
    """Turns a collective's failure on a strategy of several workers into `WorkerLost` (one line, TensorFlow's
    own first line kept), instead of a traceback; other errors, and every error on one worker, pass unchanged."""
    try:
        yield
    except _PEER_ERRORS as error:
        if _worker_count(strategy) == 1:
            raise
        first_line = (error.message or type(error).__name__).strip().splitlines()[0]
        raise WorkerLost(
            f"a worker of this {_worker_count(strategy)}-worker job failed or became unreachable "
            f"(TensorFlow: {type(error).__name__}: {first_line}); restart every worker with the same arguments "
            "to resume the job"
        ) from None


def _detect_strategy() -> str:
    """The name "auto" stands for on this machine (see `make_strategy`)."""
    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
    if sum(len(tasks) for tasks in cluster.values()) > 1:
        return "multi-worker"
    if os.environ.get("TPU_NAME") or tf.config.list_physical_devices("TPU"):
        return "tpu"
    if len(tf.config.list_logical_devices("GPU")) > 1 or len(tf.config.list_logical_devices("CPU")) > 1:
        return "mirrored"
    return "default"


def _worker_count(strategy: tf.distribute.Strategy) -> int:
    """How many processes (workers) share the strategy's replicas."""
    try:
        local_replicas = len(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy has no device list: one process, one device
        return 1
    return strategy.num_replicas_in_sync // local_replicas


def agree_on_start(strategy: tf.distribute.Strategy, written: int | None) -> int:
    """Every worker learns the chief's resume row (`written`; None on other workers and on a chief that failed,
    which makes every worker fail instead of waiting forever in the first collective)."""
    if _worker_count(strategy) == 1:
        return written
    if strategy.extended.should_checkpoint:
        value = -1 if written is None else written
    else:
        value = -2  # no say: the maximum over all replicas is the chief's value
    with peers_checked(strategy):
        votes = strategy.gather(
            strategy.experimental_distribute_values_from_function(lambda _: tf.constant([value], tf.int64)), axis=0
        )
    agreed = int(tf.reduce_max(votes))
    if agreed < 0:
        raise ValueError("the chief worker could not open the output (see its log); nothing was generated.")
    return agreed
