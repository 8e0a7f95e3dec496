"""What both networks share: the input's normalisation, the loss, the metrics of each stage, logging and the injected
optimizer."""

import math
import os
import pickle
import warnings
from typing import Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.types import LRSchedulerConfig
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from models.confusion import confusion_picture

LEAVE_IT_OUT = "Give a checkpoint file, or leave it out."

NUM_CLASSES = 10


class NormalisationUnknown(RuntimeError):
    """A model asked for figures before it knows how its inputs are normalised (untrained, and no statistics)."""


class ImageClassifier(LightningModule):
    """The networks' base class: raw images in, logits out.

    Subclasses (`SeqNet`, `ConvNet`, one's own) build `self.net`, mapping normalised (N, 1, 28, 28) images to logits.

    The model takes images as the IDX files hold them, uint8 (N, 28, 28), and normalises them itself with the
    training set's mean and standard deviation (`pixel_mean`, `pixel_std`, of pixels scaled to [0, 1]). Left out,
    `setup` takes them from the datamodule when fitting starts (`MNISTDataModule.mean`, `.std`). They are
    hyperparameters, so a checkpoint is a complete classifier of raw pixels: `predict`, `export` (Lightning's
    `to_onnx`), `SeqNet.load_from_checkpoint` and a user's own code need nothing else, and a Trainer given the
    checkpoint (`test --ckpt_path`, however it is named) takes them from it (`on_load_checkpoint`). A model that
    knows none refuses to compute (`NormalisationUnknown`) rather than guess. (As buffers they would be in the state
    dict too, but DDP would broadcast them before every step: 7-12% of SeqNet's step on 2 CPU processes.)
    Batches travel to the device as uint8, a quarter of the bytes of float32, and become floats there, in `forward`.

    The optimizer and the optional LR scheduler are constructor arguments, so the CLI chooses them
    (`--model.optimizer Adadelta --model.optimizer.lr 0.01`), as the LightningCLI docs show for dependency injection.
    Without a scheduler, `one_cycle` makes the learning rate follow torch's `OneCycleLR` over the whole run, stepped
    every batch and peaking at the optimizer's `lr`: a short warm-up, then annealing, so that the weights at the end
    of a short run are good ones (a constant rate leaves them noisy). A run without a known end (`--trainer.max_epochs
    -1` and no `--trainer.max_steps`) has no cycle to plan and keeps the rate constant, as `--model.one_cycle false`
    does. The schedule also cycles the momentum (Adam's first beta) between 0.95 and 0.85 against the rate;
    `--model.cycle_momentum false` keeps the optimizer's own (`--model.optimizer.betas`). A scheduler given with
    `--model.lr_scheduler` is stepped once per epoch, Lightning's default. The default Adam is torch's fused one
    (`fused=True`), which updates every parameter in one kernel instead of several small operations per tensor: the
    training step was 1.06x as fast on CPU, and on a GPU it saves kernel launches (`--model.optimizer.fused false`
    for the per-tensor loop).

    Two speed options (measured on the 2-core development VM, 2026-11): `channels_last` (on) stores
    images and convolution weights in NHWC order, which made ConvNet's training step 1.24x as fast on CPU and which
    convolution kernels on recent GPUs prefer (SeqNet has no convolutions: nothing changes); `compile` (off)
    compiles the network's forward and backward with `torch.compile`, at a start-up cost (`reduce-overhead` or
    `max-autotune` for torch.compile's mode of that name, which use CUDA graphs on a GPU); the state dict keeps its
    keys, so checkpoints load either way. A third, `cuda_graph` (off), is for a GPU whose step is short enough that
    launching its kernels one by one is most of it (a small net, the data on the device): the network's forward and
    backward are captured in CUDA graphs at the first training step, with torch's `make_graphed_callables` (its
    "partial-network capture"), and replayed at every training step whose batch has that size, so the host launches
    two graphs instead of each kernel; the loss, the optimizer and Lightning's loop stay as they are. One process
    (several were never run here, with nothing to run them on: one GPU each), float32, the single-device or DDP
    strategy, no gradient accumulation (a replay overwrites the gradients it gave, which autograd would then add to
    themselves), not with `compile`; a smaller batch (an epoch's last) and evaluation run the network as usual.

    Each stage has its own torchmetrics objects. Under DDP they sum their states (correct predictions, loss times
    samples, sample counts) over all ranks before computing, so a validation or test figure is weighted by samples,
    not by each rank's number of batches. A TensorBoard logger also gets each epoch's confusion matrix as a picture
    (`visuals/val_confusion_matrix`, `visuals/test_confusion_matrix`) and the accuracy of each class
    (`val_per_class/acc_<k>`).
    """

    net: nn.Module

    def __init__(
        self,
        optimizer: OptimizerCallable = lambda params: torch.optim.Adam(params, lr=0.01, fused=True),
        lr_scheduler: LRSchedulerCallable | None = None,
        one_cycle: bool = True,
        cycle_momentum: bool = True,
        channels_last: bool = True,
        compile: bool | Literal["reduce-overhead", "max-autotune"] = False,
        cuda_graph: bool = False,
        pixel_mean: float | None = None,
        pixel_std: float | None = None,
        weights: str | None = None,
    ) -> None:
        super().__init__()
        if (pixel_mean is None) != (pixel_std is None):
            raise ValueError(
                "pixel_mean and pixel_std go together (the mean and standard deviation of the training"
                " set's pixels, scaled to [0, 1]): give both, or neither (the dataset's are then used)."
            )
        if pixel_std is not None and not (math.isfinite(pixel_mean) and math.isfinite(pixel_std) and pixel_std > 0):
            raise ValueError(
                f"pixel_mean {pixel_mean}, pixel_std {pixel_std}: a mean and a standard deviation more"
                " than 0 are needed (the inputs are divided by the deviation). Give others, or leave both out."
            )
        self.save_hyperparameters()
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.train_acc = MulticlassAccuracy(NUM_CLASSES, average="micro")
        self.val_acc = MulticlassAccuracy(NUM_CLASSES, average="micro")
        self.test_acc = MulticlassAccuracy(NUM_CLASSES, average="micro")
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self.val_confusion = MulticlassConfusionMatrix(NUM_CLASSES)
        self.test_confusion = MulticlassConfusionMatrix(NUM_CLASSES)
        # The model summary's sizes, the TensorBoard graph and the exported files' input: one raw image.
        self.example_input_array = torch.zeros(1, 28, 28, dtype=torch.uint8)
        # `cuda_graph`: the network's graphed forward, and the input size it was captured at; made at the first
        # training step of each fit (the parameters may have moved since the last one).
        self._graphed_forward = None
        self._graphed_shape: torch.Size | None = None
        self._step_said = True  # what a step is made of: said at a fit's first batch

    def setup(self, stage: str) -> None:
        """When fitting without statistics given, take those of the datamodule's dataset; refuse a Trainer the model
        cannot be fitted with."""
        datamodule = self.trainer.datamodule
        if stage != "fit":
            return
        self.check_fit(self.trainer, new_run=False)  # `weights`: at the fit's start, where a restored run is known
        if self.hparams.pixel_mean is None and hasattr(datamodule, "mean"):
            self.hparams.pixel_mean, self.hparams.pixel_std = datamodule.mean, datamodule.std

    def on_fit_start(self) -> None:
        """A new run starts from `weights` (with their statistics); a run Lightning restored from `ckpt_path` has its
        own, and needs the file no more."""
        if self.hparams.weights and self.trainer.ckpt_path is None:
            saved = self.saved_weights()  # (refused in one line where it is none to start from)
            self.on_load_checkpoint(saved)
            self.load_state_dict(saved["state_dict"])

    def check_fit(self, trainer: Trainer, new_run: bool) -> None:
        """Refuse a Trainer this model cannot be fitted with (what `cuda_graph` needs), settings its optimizer refuses
        (torch's ValueError, once built on the parameters), and for a `new_run` (no checkpoint restored) `weights`
        it cannot start from. train.py asks before it starts the processes; `setup` asks again, and `on_fit_start`
        reads `weights` as `saved_weights` does, for a Trainer of a user's own code."""
        if new_run and self.hparams.weights:
            self.saved_weights()
        if trainer.state.fn is None:  # not fitting yet: Lightning builds the optimizer it trains with later
            self.configure_optimizers()
        if not self.hparams.cuda_graph:
            return
        needs = {
            "a CUDA GPU (--trainer.accelerator gpu)": trainer.strategy.root_device.type == "cuda",
            "one process (--trainer.devices 1 --trainer.num_nodes 1)": trainer.world_size == 1,
            "--trainer.strategy auto or ddp": isinstance(trainer.strategy, SingleDeviceStrategy | DDPStrategy),
            "float32 (--trainer.precision 32-true)": trainer.precision == "32-true",
            "no gradient accumulation (--trainer.accumulate_grad_batches 1)": trainer.accumulate_grad_batches == 1,
            "no --model.compile": not self.hparams.compile,
        }
        missing = [need for need, met in needs.items() if not met]
        if missing:
            raise MisconfigurationException(
                f"--model.cuda_graph true needs {' and '.join(missing)}. Give those, or --model.cuda_graph false."
            )

    def on_train_start(self) -> None:
        """Plan the one-cycle schedule over the run's steps, from the step it has reached (a continued run's, extended
        or not: planned here, once Lightning restored the loader's position, the optimizer and the step), and capture
        the network again at this fit's first step (`cuda_graph`): its parameters may have moved since."""
        self._graphed_forward = self._graphed_shape = None
        self._step_said = False  # at the first batch
        total, trainer = self.trainer.estimated_stepping_batches, self.trainer
        if not self.hparams.one_cycle or self.lr_scheduler is not None or not 1 <= total < math.inf:
            return  # a scheduler of one's own; no training step, or no known end: the optimizer's constant rate
        if trainer.global_step > total:  # a continued run given fewer steps than it has taken
            raise MisconfigurationException(
                f"the run is at step {trainer.global_step}, past the {int(total)} steps its one-cycle schedule would"
                " span: give it more (--trainer.max_epochs, --trainer.max_steps, --trainer.limit_train_batches)."
            )
        optimizer = trainer.optimizers[0]
        peaks = [group.get("max_lr", group["lr"]) for group in optimizer.param_groups]  # a continued run's groups
        cycle = self.hparams.cycle_momentum and ("momentum" in optimizer.defaults or "betas" in optimizer.defaults)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, peaks, total_steps=int(total), cycle_momentum=cycle)
        with warnings.catch_warnings():  # torch warns of a schedule stepped before its optimizer: on purpose here
            warnings.simplefilter("ignore", UserWarning)
            for _step in range(trainer.global_step):
                schedule.step()
        trainer.strategy.lr_scheduler_configs = [LRSchedulerConfig(schedule, interval="step")]
        if trainer.global_step:
            rank_zero_info(
                f"Continuing at step {trainer.global_step}: the one-cycle schedule is planned over {int(total)} steps,"
                f" peaking at learning rate {peaks[0]:g}."
            )

    def on_train_batch_start(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """At the fit's first batch, say and log what one optimizer step is made of, so that a user sees what
        `--devices` changes (docs/configuration.md): the global batch, the learning rate, the steps of an epoch (the
        last one takes the batches left over) and of the run."""
        if self._step_said:
            return
        self._step_said, trainer = True, self.trainer
        per_device = len(batch[0])  # a batch of the configured size, or a process's whole share of a smaller set
        global_batch = per_device * trainer.world_size * trainer.accumulate_grad_batches
        per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
        total, group = trainer.estimated_stepping_batches, trainer.optimizers[0].param_groups[0]
        lr = (
            f"peak learning rate {group['max_lr']:g} (one-cycle)"
            if "max_lr" in group
            else f"learning rate {group['lr']:g}"
        )
        processes = f"{trainer.world_size} process{'es' * (trainer.world_size != 1)}"
        rank_zero_info(
            f"Global batch {global_batch} = {per_device} per device x {processes} x"
            f" {trainer.accumulate_grad_batches} accumulated; {lr}; {per_epoch} optimizer step{'s' * (per_epoch != 1)}"
            f" per epoch{f', {int(total)} in the run' if math.isfinite(total) else ''}."
        )
        for logger in self.loggers:
            logger.log_metrics(
                {"workload/global_batch_size": global_batch, "workload/world_size": trainer.world_size}, 0
            )

    def on_train_end(self) -> None:
        """Let the graphs and their memory go: evaluation and a saved module need none."""
        self._graphed_forward = self._graphed_shape = None

    def on_before_backward(self, loss: Tensor) -> None:
        """With `cuda_graph`, a gradient left from the batch before means accumulation, which the graphs would make
        wrong silently (`--trainer.accumulate_grad_batches` is refused before the start; this is any other way:
        `GradientAccumulationScheduler`, gradients zeroed rather than set to None)."""
        if self._graphed_forward is not None and any(p.grad is not None for p in self.net.parameters()):
            raise MisconfigurationException(
                "--model.cuda_graph true cannot add up gradients over several batches (gradient accumulation, or"
                " gradients zeroed instead of set to None between steps): give --model.cuda_graph false."
            )

    def saved_weights(self) -> dict:
        """The checkpoint `weights` names, refused in one line where this network cannot start from it: no file, one
        torch cannot read as a checkpoint (cut short, not torch's, more than tensors), or another network's tensors."""
        weights, name = self.hparams.weights, type(self).__name__
        if not os.path.isfile(weights):
            raise MisconfigurationException(f"--model.weights {weights}: no such file. {LEAVE_IT_OUT}")
        try:
            saved = torch.load(weights, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as error:
            why = f" ({error.strerror})" if isinstance(error, OSError) and error.strerror else ""
            raise MisconfigurationException(
                f"--model.weights {weights}: torch cannot read it as a checkpoint{why}: a file cut short, another kind"
                f" of file, or one that holds more than tensors. {LEAVE_IT_OUT}"
            ) from error
        if not isinstance(saved, dict) or not isinstance(state := saved.get("state_dict"), dict):
            raise MisconfigurationException(
                f"--model.weights {weights}: not a Trainer's checkpoint (no state_dict in it: a file torch.save"
                f" wrote, a module's state_dict alone?). {LEAVE_IT_OUT}"
            )
        own = self.state_dict()
        shapes = {key for key in own.keys() & state.keys() if own[key].shape != state[key].shape}
        if differ := sorted(set(own) ^ set(state) | shapes):
            raise MisconfigurationException(
                f"--model.weights {weights}: not the tensors of this {name} ({len(differ)} differ, the first"
                f" {differ[0]}): weights of another network or other sizes. Give a checkpoint of such a {name}, or"
                " leave it out."
            )
        return saved

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """The weights come with the normalisation they were trained with: whichever way the module was built (a
        run's `config.yaml`, which holds no statistics when the run started without them, or other settings), a
        checkpoint's statistics replace its own, so one checkpoint gives one answer however it is named."""
        saved = checkpoint.get("hyper_parameters") or {}
        if saved.get("pixel_mean") is not None:
            self.hparams.pixel_mean, self.hparams.pixel_std = saved["pixel_mean"], saved["pixel_std"]

    def configure_model(self) -> None:
        """Apply the speed options to the network that the subclass built; Lightning calls this before each stage."""
        if self.hparams.channels_last:
            self.net.to(memory_format=torch.channels_last)
            if self._trained_on_a_gpu():
                self._plain_strides_where_both_layouts_agree()
        if self.hparams.compile:
            self.net.compile(mode=None if self.hparams.compile is True else self.hparams.compile)

    def _trained_on_a_gpu(self) -> bool:
        """Whether the Trainer this module is attached to puts it on a GPU; not attached to one: no."""
        try:
            trainer = self.trainer
        except RuntimeError:  # not attached: configure_model called by hand (benchmarks/plain_ddp.py)
            return False
        return trainer.strategy.root_device.type == "cuda"

    def _plain_strides_where_both_layouts_agree(self) -> None:
        """On a GPU, a weight that is the same in both layouts (the first convolution's: one input channel) keeps the
        plain strides. cuDNN gives its gradient those, while DDP's bucket view has the weight's strides: DDP said
        "Grad strides do not match bucket view strides" once per run. On the CPU the gradient takes the weight's
        channels_last strides, and the plain ones made ConvNet's step 1.3x as slow there."""
        for parameter in self.net.parameters():
            if parameter.dim() == 4 and parameter.shape[1] == 1:
                parameter.data = parameter.data.clone(memory_format=torch.contiguous_format)

    def forward(self, images: Tensor) -> Tensor:
        """uint8 images (N, 28, 28) -> logits (N, 10), normalised with `pixel_mean` and `pixel_std`."""
        return self.net(self._normalised(images))

    def _normalised(self, images: Tensor) -> Tensor:
        """uint8 images (N, 28, 28) -> the network's input (N, 1, 28, 28)."""
        mean, std = self.hparams.pixel_mean, self.hparams.pixel_std
        if mean is None or std is None:  # a guess would give confident, wrong figures
            raise NormalisationUnknown(
                f"{type(self).__name__} does not know the normalisation of its inputs (pixel_mean, pixel_std): it was"
                " neither trained nor loaded from a checkpoint. Load trained weights (load_from_checkpoint, or"
                " --ckpt_path), fit it, or give pixel_mean and pixel_std."
            )
        images = (images.unsqueeze(1).to(self.dtype) / 255 - mean) / std  # float32, or --trainer.precision's
        if self.hparams.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    def _graphed_logits(self, images: Tensor) -> Tensor:
        """The training step's forward with `cuda_graph`: the graphs captured at this fit's first step (again at a
        larger batch: a run continued at an epoch's last batch), replayed for a batch of that size; a smaller one
        (an epoch's last) runs the network as usual."""
        inputs = self._normalised(images)
        if self._graphed_forward is None or len(inputs) > self._graphed_shape[0]:
            self._capture(inputs)
        if inputs.shape != self._graphed_shape:
            return self.net(inputs)
        return self._graphed_forward(inputs)

    def _capture(self, images: Tensor) -> None:
        """Capture the network's forward and backward for inputs like `images` (torch runs it three times first, to
        warm up); BatchNorm's running statistics are put back as they were before those runs."""
        buffers = [buffer.clone() for buffer in self.net.buffers()]
        with torch.autograd.set_detect_anomaly(False):  # its checks read values back, which a capture cannot
            torch.cuda.make_graphed_callables(self.net, (images,))  # replaces the module's forward with the graph's
        self._graphed_forward, self._graphed_shape = self.net.forward, images.shape
        del self.net.forward  # the module's own forward again, for evaluation and batches of other sizes
        for buffer, saved in zip(self.net.buffers(), buffers, strict=True):
            buffer.copy_(saved)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, targets = batch
        logits = self._graphed_logits(images) if self.hparams.cuda_graph else self(images)
        loss = F.cross_entropy(logits, targets)
        # Per-step curves of this rank's batches. Lightning writes them every `log_every_n_steps` steps only, so
        # they are computed on those steps only: elsewhere they would cost time (and on a GPU a host-device
        # synchronisation when Lightning reads them) for values nobody sees.
        every = self.trainer.log_every_n_steps  # 0: never, as Lightning reads it
        if every and (self.global_step + 1) % every == 0:
            self.log("train/loss", loss, prog_bar=True)
            self.log("train/acc", self.train_acc(logits, targets))
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_loss, self.val_acc, self.val_confusion)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_loss, self.test_acc, self.test_confusion)

    def _evaluate(
        self,
        batch: tuple[Tensor, Tensor],
        stage: str,
        loss: MeanMetric,
        acc: MulticlassAccuracy,
        confusion: MulticlassConfusionMatrix,
    ) -> None:
        images, targets = batch
        logits = self(images)
        loss.update(F.cross_entropy(logits, targets), weight=len(targets))
        acc.update(logits, targets)
        confusion.update(logits, targets)
        # Logging the metric objects: Lightning calls compute() (synced across ranks) at epoch end, then resets.
        self.log(f"{stage}/loss", loss, prog_bar=True)
        self.log(f"{stage}/acc", acc, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        self._log_confusion("val", self.val_confusion)

    def on_test_epoch_end(self) -> None:
        self._log_confusion("test", self.test_confusion)

    def _log_confusion(self, stage: str, confusion: MulticlassConfusionMatrix) -> None:
        """The epoch's confusion matrix (rows: true class), summed over the ranks (every rank runs this), drawn in
        TensorBoard by global rank 0, with the validation's accuracy of each class."""
        matrix = confusion.compute().cpu()
        confusion.reset()
        if self.trainer.sanity_checking or not self.trainer.is_global_zero:
            return
        names = getattr(self.trainer.datamodule, "class_names", None) or [str(k) for k in range(NUM_CLASSES)]
        for logger in (logger for logger in self.loggers if isinstance(logger, TensorBoardLogger)):
            if stage == "val":
                for label, accuracy in enumerate((matrix.diag() / matrix.sum(dim=1).clamp(min=1)).tolist()):
                    logger.experiment.add_scalar(f"val_per_class/acc_{label}", accuracy, self.global_step)
            picture = confusion_picture(matrix, names)
            logger.experiment.add_image(
                f"visuals/{stage}_confusion_matrix", picture, self.global_step, dataformats="HWC"
            )

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Each image's predicted class and its probability, and its label where it is known (not a user's own
        pictures, labelled -1)."""
        images, targets = batch
        probability, prediction = self(images).softmax(dim=1).max(dim=1)
        known = {"target": targets} if bool((targets >= 0).all()) else {}
        return {"prediction": prediction, "probability": probability, **known}

    def configure_optimizers(self):
        """The optimizer, and a scheduler given as `lr_scheduler`; the one-cycle schedule is planned as training
        starts (`on_train_start`), when the run's steps are known without building the loader before its position
        is restored."""
        optimizer = self.optimizer(self.parameters())
        if self.lr_scheduler is not None:
            return {"optimizer": optimizer, "lr_scheduler": self.lr_scheduler(optimizer)}
        return optimizer
