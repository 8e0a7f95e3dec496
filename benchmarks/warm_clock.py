"""Training time as a speed record measures it: training only, the device synchronised, its warm-up excluded.

A record's time (tuomaso/train_mnist_fast: `%%timeit` over the whole training, in a process that has run it before)
leaves out what a process pays once: loading the GPU's kernels on their first call, cuDNN choosing its algorithms.
train.py runs once per process, so its first steps pay that. This callback pays it before the clock starts, on a
copy of the model (forward, backward and an optimizer of the model's own kind on a batch of the training set), so
that the weights trained and the order of the data are those of a run without it; then it times the training steps
of each epoch (`TrainingClock`, which `device_step.py` uses too): what runs between them, validation, checkpoints and
the dashboard, is left out, and the device is synchronised where the clock starts and stops. Rank 0 prints one
line, `warm training s: SECONDS`, which `variants.py` reads.

    python train.py ... --trainer.callbacks+=benchmarks.warm_clock.WarmClock
"""

import itertools
import time

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback
from torch.func import functional_call


class TrainingClock(Callback):
    """Wall time of the training steps after the first `skip_steps`, epoch by epoch: from an epoch's start (or the end
    of step `skip_steps`) to the end of its last step, the device synchronised at both ends. What runs between the
    epochs' steps (validation, checkpoints, the dashboard) is left out."""

    def __init__(self, skip_steps: int = 0) -> None:
        self.skip_steps, self.batches, self.steps, self.seconds, self.started = skip_steps, 0, 0, 0.0, None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.batches >= self.skip_steps:
            self._start(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.batches += 1
        self.steps += self.started is not None
        if batch_idx + 1 == trainer.num_training_batches or trainer.global_step == trainer.max_steps:
            self._stop(pl_module)
        elif self.batches == self.skip_steps:
            self._start(pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._stop(pl_module)

    def ms_per_step(self) -> float:
        return 1000 * self.seconds / self.steps

    def _start(self, pl_module) -> None:
        self._sync(pl_module)
        self.started = time.perf_counter()

    def _stop(self, pl_module) -> None:
        if self.started is not None:
            self._sync(pl_module)
            self.seconds += time.perf_counter() - self.started
            self.started = None

    @staticmethod
    def _sync(pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)


class WarmClock(TrainingClock):
    """TrainingClock of every step, its warm-up paid first on a copy of the model; rank 0 prints the seconds."""

    def __init__(self, warmup_steps: int = 3) -> None:
        super().__init__()
        self.warmup_steps = warmup_steps

    def on_train_start(self, trainer, pl_module) -> None:
        self._warm_up(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        if trainer.is_global_zero:
            print(f"warm training s: {self.seconds:.4f}", flush=True)

    def _warm_up(self, trainer, pl_module) -> None:
        """Forward, backward and an optimizer step of a copy, on the first `batch_size` images of the training set."""
        images, targets = (t[: trainer.datamodule.hparams.batch_size] for t in trainer.datamodule.train_set.tensors)
        images, targets = images.to(pl_module.device), targets.to(pl_module.device)
        # Copies of the weights and buffers (BatchNorm's statistics), in their memory layout, run through the model's
        # own forward: the copies change, the model does not.
        tensors = itertools.chain(pl_module.named_parameters(), pl_module.named_buffers())
        twin = {name: t.detach().clone().requires_grad_(t.requires_grad) for name, t in tensors}
        kind = trainer.optimizers[0]
        optimizer = type(kind)([t for t in twin.values() if t.requires_grad], **kind.defaults)
        for _ in range(self.warmup_steps):
            F.cross_entropy(functional_call(pl_module, twin, (images,)), targets).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
