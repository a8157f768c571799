"""The built-in digits workload in Keras under tf.distribute.MultiWorkerMirroredStrategy.

What "exact" means here: op determinism on (``tf.config.experimental.enable_op_determinism``),
every random draw seeded by the workload's seed, the global batch of step ``s`` a pure function
of the seed and ``s`` (no input pipeline state to save), and the optimizer's state (momentum,
its step counter ``iterations``) in the checkpoint. A run that is killed, preempted or resumed
then ends with the same weights, bit for bit, as one that never stopped, on the same number of
workers (a TensorFlow job resumes on its own world size only). The model has no dropout: its
random state would have to be checkpointed too.

Preemption: SIGTERM sets a flag; after every step the workers all-reduce it, so all of
them stop after the same step, checkpoint it and exit 75, as a PyTorch job does.
"""

from __future__ import annotations

import hashlib
import math
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.errors import (
    EXIT_PREEMPTED,
    CheckpointError,
    CheckpointMismatchError,
    GpufleetError,
    NonFiniteError,
    NoUsableCheckpointError,
)
from gpufleet.frameworks.tf import checkpoints as ckpt
from gpufleet.frameworks.tf.checkpoints import TfCheckpoints
from gpufleet.launch.fatal import write_fatal
from gpufleet.runtime.context import JobContext, restart_count
from gpufleet.runtime.files import write_json_atomic
from gpufleet.runtime.rundir import RunDir
from gpufleet.spec import DigitsWorkload
from gpufleet.workloads.digits_data import MOMENTUM, batch_indices, digits_split


def log(message: str) -> None:
    print(message, flush=True)


def preemption_flag(requested: threading.Event | None = None) -> threading.Event:
    """An event set by SIGTERM or SIGINT (a node drain, Kueue, Ctrl-C): the loop stops at a
    step boundary all workers agree on. Called again with its event once the strategy exists:
    TensorFlow's coordination service installs its own SIGTERM handler then (its
    PreemptionNotifier, for PreemptionCheckpointHandler), which would swallow the signal."""
    requested = requested or threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: requested.set())
    return requested


def digits_model(tf: Any) -> Any:
    """Two conv layers, max-pool, two dense layers (the PyTorch CNN's shape, without dropout)."""
    layers = tf.keras.layers
    return tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        layers.Conv2D(16, 3, padding="same", activation="relu"),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(32, activation="relu"),
        layers.Dense(10),
    ])  # fmt: skip


def weights_digest(model: Any) -> str:
    """sha256 over every weight's path, dtype, shape and bytes, sorted by path: equal digests
    mean bit-identical weights."""
    h = hashlib.sha256()
    for variable in sorted(model.weights, key=lambda v: v.path):
        value = np.ascontiguousarray(variable.numpy())
        h.update(variable.path.encode())
        h.update(str(value.dtype).encode())
        h.update(str(value.shape).encode())
        h.update(value.tobytes())
    return h.hexdigest()


def model_fingerprint(model: Any) -> str:
    """16 hex digits over every weight's path, shape and dtype: a checkpoint written by another
    model (a PyTorch job's of the same name included) is refused, not half loaded."""
    h = hashlib.sha256()
    for variable in sorted(model.weights, key=lambda v: v.path):
        h.update(f"{variable.path}:{tuple(variable.shape)}:{variable.dtype}\n".encode())
    return h.hexdigest()[:16]


class DigitsRun:
    """One worker's share of the digits training (every worker builds one)."""

    def __init__(
        self, tf: Any, w: DigitsWorkload, context: JobContext, requested: threading.Event
    ) -> None:
        self.tf, self.w, self.context = tf, w, context
        tf.keras.utils.set_random_seed(w.seed)
        tf.config.experimental.enable_op_determinism()
        comms = tf.distribute.experimental
        options = comms.CommunicationOptions(
            implementation=comms.CommunicationImplementation.RING,
            timeout_seconds=context.hang_timeout or None,  # a lost peer ends the collective
        )
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        preemption_flag(requested)
        resolver = self.strategy.cluster_resolver
        spec = resolver.cluster_spec().as_dict() if resolver else {}
        self.world = max(1, len(spec.get("worker", [])))
        self.index = int(resolver.task_id or 0) if resolver and self.world > 1 else 0
        self.chief = self.index == 0
        self.global_batch = w.batch_size * self.world
        self.images, self.labels, self.train_idx, self.test_idx = digits_split(w.seed)
        with self.strategy.scope():
            self.model = digits_model(tf)
            schedule = tf.keras.optimizers.schedules.CosineDecay(w.lr, decay_steps=w.steps)
            self.optimizer = tf.keras.optimizers.SGD(schedule, momentum=MOMENTUM)
            self.optimizer.build(self.model.trainable_variables)
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer)
        fingerprint = model_fingerprint(self.model)
        self.store = TfCheckpoints(
            context.checkpoint.root(context.run_dir),
            every_steps=context.checkpoint.every_steps,
            keep=context.checkpoint.keep,
            identity={"job": context.name, "workload": "digits-tensorflow", "model": fingerprint},
            chief=self.chief,
            log=log,
        )
        self.files = RunDir(context.run_dir)
        self._step_fn = self._compile_step()

    def _compile_step(self) -> Callable[..., Any]:
        tf, model, optimizer, strategy = self.tf, self.model, self.optimizer, self.strategy
        global_batch = self.global_batch

        def replica(x: Any, y: Any, stop: Any) -> Any:
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                per_sample = tf.keras.losses.sparse_categorical_crossentropy(
                    y, logits, from_logits=True
                )
                loss = tf.nn.compute_average_loss(per_sample, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            # One all-reduce for both (an input tensor all-reduced alone fails in MWMS with
            # "destinations can not be empty"): the global mean loss and the stop requests.
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce("sum", tf.stack([loss, stop]))

        def step(x: Any, y: Any, stop: Any) -> Any:
            reduced = strategy.run(replica, args=(x, y, stop))
            return strategy.experimental_local_results(reduced)[0]

        compiled: Callable[..., Any] = tf.function(step)  # one graph, traced at the first step
        return compiled

    def from_chief(self, values: list[float]) -> list[int]:
        """The chief's ``values`` on every worker (a collective: all workers call it; the
        others add zeros)."""
        tf, mine = self.tf, values if self.chief else [0.0] * len(values)
        reduced = self.strategy.run(  # the tensor made in the replica: see _compile_step
            lambda: tf.distribute.get_replica_context().all_reduce("sum", tf.constant(mine))
        )
        return [int(v) for v in self.strategy.experimental_local_results(reduced)[0].numpy()]

    def restore(self) -> int | None:
        """Load the newest usable checkpoint: the chief decides which and names its directory
        to the others (no worker lists the directory itself); the step, or None when fresh.
        A verdict against resuming ends every worker with the chief's error and exit code."""
        verdict, name = ckpt.NONE, None
        error: Exception | None = None
        if self.chief:
            try:
                found = self.store.newest_usable(self.world)
                verdict, name = (ckpt.FOUND, found.name) if found else (ckpt.NONE, None)
            except NoUsableCheckpointError as exc:
                verdict, error = ckpt.NO_USABLE, exc
            except CheckpointError as exc:  # another job's or model's, another world size
                verdict, error = ckpt.REFUSED, exc
            except Exception as exc:  # storage: the group restarts
                verdict, error = ckpt.FAILED, exc
            if isinstance(error, GpufleetError) and error.fatal:
                # Recorded before the others learn of it: the launcher reports the first
                # fatal error recorded, and theirs only points here.
                write_fatal(Path(self.context.run_dir), error.exit_code, str(error), self.index)
        verdict, name = ckpt.decode(self.from_chief(ckpt.encode(verdict, name)))
        if error is not None:
            raise error
        where = f"{self.store.root} (worker 0's log says why)"
        if verdict == ckpt.NO_USABLE:
            raise NoUsableCheckpointError(f"no usable checkpoint in {where}")
        if verdict == ckpt.REFUSED:
            raise CheckpointMismatchError(f"the newest checkpoint in {where} cannot be resumed")
        if verdict == ckpt.FAILED:
            raise CheckpointError(f"worker 0 could not read the checkpoints in {where}")
        if name is None:
            return None
        self.checkpoint.read(str(self.store.root / name / ckpt.PREFIX)).assert_consumed()
        return int(self.optimizer.iterations.numpy())

    def save(self, step: int) -> str:
        """Checkpoint ``step`` on every worker (collective): the chief makes the directory and
        names it to the others; its path, on every worker."""
        name = self.store.new_dir(step).name if self.chief else None
        _, name = ckpt.decode(self.from_chief(ckpt.encode(ckpt.FOUND, name)))
        assert name is not None  # FOUND always names one
        path = self.store.root / name
        self.store.write(path, step, self.checkpoint.write, world_size=self.world)
        if self.chief:
            log(f"gpufleet: checkpoint step {step} -> {path}")
        return str(path)

    def fit(self, requested: threading.Event) -> dict[str, Any]:
        """Train to the workload's step count (or to an agreed preemption); the result."""
        resumed = self.restore()
        step = int(self.optimizer.iterations.numpy())
        if resumed is not None and self.chief:
            log(f"gpufleet: resumed from step {resumed}")
        loss, last, seconds, started = math.nan, "", [], time.perf_counter()
        while step < self.w.steps:
            x, y = self._batch(step)
            t0 = time.perf_counter()
            reduced = self._step_fn(x, y, self.tf.constant(float(requested.is_set()))).numpy()
            loss, step = float(reduced[0]), step + 1
            seconds.append(time.perf_counter() - t0)
            if not math.isfinite(loss):
                raise NonFiniteError(f"loss is {loss} at step {step}: stopped before saving it")
            preempted = float(reduced[1]) > 0  # any worker asked to stop
            if step % self.w.log_every == 0 or step == self.w.steps:
                self._report(step, loss, seconds)
            if self.store.should_save(step, final=step == self.w.steps, preempted=preempted):
                last = self.save(step)
            if preempted:
                return self._result(step, loss, last, resumed, seconds, started, preempted=True)
        return self._result(step, loss, last, resumed, seconds, started, preempted=False)

    def _batch(self, step: int) -> tuple[Any, Any]:
        idx = batch_indices(self.train_idx, self.w.seed, step, self.global_batch)
        mine = idx[self.index * self.w.batch_size : (self.index + 1) * self.w.batch_size]
        return self.tf.constant(self.images[mine][..., None]), self.tf.constant(self.labels[mine])

    def _report(self, step: int, loss: float, seconds: list[float]) -> None:
        recent = seconds[-self.w.log_every :]
        rate = len(recent) * self.global_batch / sum(recent) if sum(recent) > 0 else 0.0
        if not self.chief:
            return
        log(f"step {step}/{self.w.steps} loss {loss:.4f} {rate:,.0f} samples/s")
        write_json_atomic(self.files.progress, {
            "step": step, "steps": self.w.steps, "loss": loss, "samples_per_second": rate,
            "restart_count": restart_count(), "time": time.time(),
        })  # fmt: skip

    def accuracy(self) -> float:
        """Top-1 accuracy on the held-out split."""
        x = self.images[self.test_idx][..., None]
        predicted = np.argmax(self.model(x, training=False).numpy(), axis=1)
        return float(np.mean(predicted == self.labels[self.test_idx]))

    def _result(
        self,
        step: int,
        loss: float,
        checkpoint: str,
        resumed: int | None,
        seconds: list[float],
        started: float,
        *,
        preempted: bool,
    ) -> dict[str, Any]:
        total = sum(seconds)
        return {
            "steps": step,
            "final_loss": loss,
            "state_digest": weights_digest(self.model),
            "checkpoint": checkpoint or None,
            "resumed_from": resumed,
            "restart_count": restart_count(),
            "samples_per_second": len(seconds) * self.global_batch / total if total else 0.0,
            "preempted": preempted,
            "metrics": {} if preempted else {"accuracy": self.accuracy()},
            "wall_seconds": time.perf_counter() - started,
        }


def run(context: JobContext, requested: threading.Event) -> int:
    """Train the digits workload of ``context``; write result.json (the chief) and, after a
    preemption checkpoint, preempted.json (every worker: each is its node's first)."""
    import tensorflow as tf

    job = DigitsRun(tf, DigitsWorkload.model_validate(context.workload), context, requested)
    result = job.fit(requested)
    files = job.files
    if job.chief:
        write_json_atomic(files.result, result)
        log(f"gpufleet: {result['steps']} steps; state digest {result['state_digest']}")
    if not result["preempted"]:
        return 0
    write_json_atomic(files.preempted, {"step": result["steps"],
                                        "checkpoint": result["checkpoint"]})  # fmt: skip
    if job.chief:
        log(f"gpufleet: preempted at step {result['steps']}; checkpoint {result['checkpoint']}")
    return EXIT_PREEMPTED


def main() -> int:
    """``python -m gpufleet.frameworks.tf``: the workload named in GPUFLEET_WORKLOAD."""
    requested = preemption_flag()
    context = JobContext.from_env()
    if context.workload.get("name") != "digits":
        log(f"gpufleet: no TensorFlow workload {context.workload.get('name')!r}")
        return 2
    Path(context.run_dir).mkdir(parents=True, exist_ok=True)
    return run(context, requested)
