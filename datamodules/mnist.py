"""MNIST and FashionMNIST in one LightningDataModule that serves whole uint8 batches.

torchvision decodes each IDX file into a single uint8 tensor (`.data`, `.targets`). The tutorials then turn
every sample into a PIL image and back (`ToTensor()`), which costs more than the tiny networks do. Here a batch
is one indexing operation on that tensor; it travels to the device as uint8 (a quarter of the bytes of float32),
where the model normalises it with the statistics this module names (`mean`, `std`; models/base.py).
"""

import multiprocessing.util
import os
import re
import shlex
import shutil
import signal
from functools import partial
from pathlib import Path
from typing import Any

import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt, register_type
from lightning.fabric.utilities.seed import pl_worker_init_function
from lightning.pytorch import LightningDataModule
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchvision.datasets import MNIST, FashionMNIST

from datamodules.images import mnist_pixels
from datamodules.sampler import ResumableDistributedSampler

# torchvision class, mean and std of the training images (pixel values scaled to [0, 1]).
DATASETS = {
    "mnist": (MNIST, 0.1307, 0.3081),
    "fashion_mnist": (FashionMNIST, 0.2860, 0.3530),
}
TRAIN_SET_SIZE = 60_000  # of the official files; the tests use smaller ones


def _file_names(dataset_class: type) -> list[str]:
    return [name.removesuffix(".gz") for name, _md5 in dataset_class.resources]


def _holds_the_files(dataset_class: type, folder: Path) -> bool:
    return all((folder / name).is_file() for name in _file_names(dataset_class))


def leave_stops_to_the_training_process(worker_id: int, rank: int | None = None) -> None:
    """In a DataLoader worker: ignore Ctrl-C, SIGTERM and SIGHUP, which often reach every process of the job at once
    (a closed terminal, `kill -- -PGID`, SLURM signalling a job step). The training process stops at the step every
    rank agrees on (app/callbacks/graceful_stop.py) and ends its workers itself; a worker killed by the signal would
    end the run first, with torch's "DataLoader worker is killed by signal" and nothing saved. A worker whose training
    process dies ends by itself (torch's watchdog), and one left when it exits is killed (`end_workers_left_at_exit`).
    Lightning's seeding of workers is kept, with the rank it would give: it adds its own `worker_init_fn` only to a
    loader that has none."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        pl_worker_init_function(worker_id, rank=rank)


def end_workers_left_at_exit() -> None:
    """When the training process exits, kill its daemonic children that ignore SIGTERM: the DataLoader workers of a
    loader left iterating outside a Trainer (whose teardown ends them). Python's exit ends daemonic children with
    SIGTERM and then waits for each: for these, for ever. A multiprocessing finalizer, so it runs before that, after
    the finalizers that end a `Pool`'s workers, and also in a process that multiprocessing started, where atexit
    handlers do not run. torch's SIGCHLD handler, which would report each kill as a failed worker, is put back to the
    default first."""
    children = [child for child in multiprocessing.active_children() if child.daemon and _ignores_sigterm(child.pid)]
    if children:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        child.kill()


def _ignores_sigterm(pid: int) -> bool:
    """From Linux's /proc; elsewhere, taken as true."""
    try:
        ignored = re.search(r"^SigIgn:\s*([0-9a-f]+)$", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    except OSError:
        return True
    return ignored is None or bool(int(ignored.group(1), 16) >> (signal.SIGTERM - 1) & 1)


class DatasetName(str):
    """`--data.dataset`: mnist or fashion_mnist, however a user writes them (MNIST, FashionMNIST, fashion-mnist)."""

    def __new__(cls, name: str) -> "DatasetName":
        spelled = {key.replace("_", ""): key for key in DATASETS}
        key = spelled.get(str(name).lower().replace("-", "").replace("_", ""))
        if key is None:
            raise ValueError(f"{name!r}: expected one of {', '.join(DATASETS)}")
        return super().__new__(cls, key)


register_type(DatasetName, serializer=str, deserializer=DatasetName)


class DataError(MisconfigurationException):
    """The dataset files are missing, cannot be downloaded or are corrupt, or the data's settings do not fit the
    job; the message says how to fix it (Lightning's class for a mistake in what a run was given)."""


class BatchedTensorDataset(TensorDataset):
    """A TensorDataset that gives the DataLoader a whole batch from one indexing operation.

    The DataLoader calls `__getitems__` with the batch's indices (chosen by whatever sampler Lightning put in,
    a `DistributedSampler` under DDP) instead of calling `__getitem__` once per sample.
    """

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, ...]:
        index, device = torch.tensor(indices), self.tensors[0].device
        if device.type == "cuda":  # data held on the GPU (`on_device`)
            # From page-locked memory the copy is queued like a kernel; from ordinary memory it would wait for the
            # GPU to finish every step queued before it, so that the host could never run ahead of the device.
            index = index.pin_memory().to(device, non_blocking=True)
        return self[index]


def already_batched(batch: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Collate function for `BatchedTensorDataset`: the batch is built already, so pass it through."""
    return batch


class MNISTDataModule(LightningDataModule):
    """MNIST or FashionMNIST: a train/val split of the official 60k training images and the official 10k test set.

    Args:
        dataset: Which dataset to load: mnist or fashion_mnist (in any case: MNIST, FashionMNIST).
        data_dir: Folder holding `MNIST/raw/` or `FashionMNIST/raw/` (torchvision's layout); downloaded there if
            missing.
        batch_size: Samples per batch *per device*. Under DDP one optimizer step sees
            `batch_size * devices * num_nodes` samples (the global batch, printed at start).
        num_workers: DataLoader worker processes per device. Batches are slices of a tensor in memory, so 0 is
            usually fastest.
        eval_batch_size: Samples per validation/test/predict batch per device. Evaluation keeps no activations
            for a backward pass, so it takes larger batches than training, and fewer steps.
        pin_memory: Put batches in page-locked memory, so that their copy to a GPU can overlap computation.
        on_device: Hold each split's images and labels on the training device (each process's GPU) and cut the
            batches there: no copy from host memory per batch. MNIST's training images take 47 MB as uint8.
        val_size: Images held out of the training set for validation.
        val_split_seed: Seed of the train/val split; fixed so that every rank and every run holds out the same images.
        predict_dir: `predict` reads every image file of this folder (in name order) instead of the official test
            set; each is turned into a 28x28 image like the dataset's (`datamodules/images.py`).
    """

    def __init__(
        self,
        dataset: DatasetName = "fashion_mnist",
        data_dir: str = "data",
        batch_size: PositiveInt = 64,
        num_workers: NonNegativeInt = 0,
        eval_batch_size: PositiveInt = 1000,
        pin_memory: bool = False,
        on_device: bool = False,
        val_size: PositiveInt = 5000,
        val_split_seed: int = 0,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__()
        dataset = str(DatasetName(dataset))  # a plain string in the hyperparameters, as a checkpoint keeps them
        if on_device and num_workers > 0:
            raise DataError(
                f"--data.on_device true needs --data.num_workers 0 (not {num_workers}): DataLoader worker processes"
                " cannot hand out batches that live on a GPU, and with the data there they have nothing left to do."
            )
        if not -(2**63) <= val_split_seed < 2**64:  # what torch's generator takes
            raise DataError(
                f"--data.val_split_seed {val_split_seed}: must be from -2**63 to 2**64 - 1. Give another value."
            )
        self.save_hyperparameters()
        if num_workers > 0:  # once a datamodule, at the process's exit
            multiprocessing.util.Finalize(None, end_workers_left_at_exit, exitpriority=0)
        self.dataset_class, self.mean, self.std = DATASETS[dataset]
        self.train_set: BatchedTensorDataset | None = None
        self.val_set: BatchedTensorDataset | None = None
        self.test_set: BatchedTensorDataset | None = None
        self.predict_set: BatchedTensorDataset | None = None
        self.predict_files: list[Path] = []  # with predict_dir: the file of each predicted image

    @property
    def raw_folder(self) -> Path:
        """Where torchvision looks for the four IDX files."""
        return Path(self.hparams.data_dir) / self.dataset_class.__name__ / "raw"

    @property
    def class_names(self) -> list[str]:
        """Label k's name: "0".."9" for MNIST, "T-shirt/top", "Trouser", ... for FashionMNIST."""
        return [name.split(" - ")[0] for name in self.dataset_class.classes]

    @property
    def file_names(self) -> list[str]:
        """The four uncompressed IDX files torchvision expects in `raw_folder`."""
        return _file_names(self.dataset_class)

    def prepare_data(self) -> None:
        """Download the files if they are missing. Lightning calls this once per node, on local rank 0.

        Files a folder off (`--data.data_dir` naming the folder that holds them, or the dataset's own folder) are
        pointed at rather than downloaded beside them; a download that fails leaves no folder it made behind. Nothing
        for a predict of a folder of pictures (`reads_the_dataset`)."""
        if not self.reads_the_dataset(predicting=self.trainer is not None and self.trainer.predicting):
            return
        if _holds_the_files(self.dataset_class, self.raw_folder):
            return
        self._point_at_files_nearby()
        made = [folder for folder in (self.raw_folder, *self.raw_folder.parents) if not folder.exists()]
        try:
            for train in (True, False):
                self.dataset_class(self.hparams.data_dir, train=train, download=True)
        except (OSError, RuntimeError) as err:
            if made:
                shutil.rmtree(made[-1], ignore_errors=True)  # the outermost folder the download made, with all in it
            reason = str(err).strip().splitlines()[-1]
            raise DataError(
                f"{self.dataset_class.__name__} is not in {self.raw_folder} and the download failed ({reason}). "
                f"Put {', '.join(self.file_names)} there (gunzip the .gz files), or point --data.data_dir at the "
                f"folder that holds {self.dataset_class.__name__}/raw/.{self._other_dataset_there()}"
            ) from err

    def reads_the_dataset(self, predicting: bool) -> bool:
        """Whether the command reads the dataset's files: all but a predict of a folder of pictures (`predict_dir`),
        which a machine without the dataset may run."""
        return not predicting or self.hparams.predict_dir is None

    def _point_at_files_nearby(self) -> None:
        """The four files in `--data.data_dir` itself, or in its `raw/`: one line that says which folder to give."""
        data_dir, name = Path(self.hparams.data_dir), self.dataset_class.__name__
        for folder in (data_dir, data_dir / "raw"):
            if not _holds_the_files(self.dataset_class, folder):
                continue
            if folder.name == "raw" and folder.parent.name == name:
                where = f"give --data.data_dir {shlex.quote(str(folder.parents[1]))}, the folder that holds {name}/raw/"
            else:
                where = f"move them into {self.raw_folder}/, where torchvision reads them"
            raise DataError(f"--data.data_dir {data_dir}: {name}'s files are in {folder}; {where}.")

    def _other_dataset_there(self) -> str:
        """Offline, with the other dataset's files at hand: which option trains on them."""
        for key, (dataset_class, _mean, _std) in DATASETS.items():
            raw = Path(self.hparams.data_dir) / dataset_class.__name__ / "raw"
            if dataset_class is not self.dataset_class and _holds_the_files(dataset_class, raw):
                return f" {dataset_class.__name__}'s files are in {raw}: --data.dataset {key} trains on them."
        return ""

    def setup(self, stage: str) -> None:
        """Load the splits this stage needs, once; every rank holds the whole split and the sampler picks its share."""
        if stage in ("fit", "validate") and self.train_set is None:
            images, targets = self._load(train=True)
            val_size = self.hparams.val_size
            if val_size >= len(images):
                raise DataError(
                    f"--data.val_size {val_size} leaves no training images: the training file holds {len(images)}."
                )
            order = torch.randperm(len(images), generator=torch.Generator().manual_seed(self.hparams.val_split_seed))
            val_index, train_index = order[:val_size], order[val_size:]
            self.train_set = BatchedTensorDataset(images[train_index], targets[train_index])
            self.val_set = BatchedTensorDataset(images[val_index], targets[val_index])
        if stage == "predict" and self.hparams.predict_dir is not None:
            if not self.hparams.predict_dir:  # `--data.predict_dir "$DIR"` with the variable unset: not the folder here
                raise DataError("--data.predict_dir '': an empty value names no folder. Give the folder of pictures.")
            if self.predict_set is None:
                self.predict_set = self._load_folder(Path(self.hparams.predict_dir))
        elif stage in ("test", "predict") and self.test_set is None:
            self.test_set = BatchedTensorDataset(*self._load(train=False))

    def _load(self, train: bool) -> tuple[Tensor, Tensor]:
        """Decode one split with torchvision, turning its errors into a message that says what to do."""
        split = "train" if train else "test"
        missing = [name for name in self.file_names if not (self.raw_folder / name).is_file()]
        if missing:
            raise DataError(f"Missing {', '.join(missing)} in {self.raw_folder}; run prepare_data or place them there.")
        try:
            dataset = self.dataset_class(self.hparams.data_dir, train=train)
        except (AssertionError, KeyError, RuntimeError, TypeError, ValueError) as err:
            raise DataError(
                f"The {split} files in {self.raw_folder} are corrupt or truncated ({type(err).__name__}: {err}). "
                "Delete them and download or copy them again."
            ) from err
        self._check_contents(split, dataset.data, dataset.targets)
        return dataset.data, dataset.targets

    def _check_contents(self, split: str, images: Tensor, targets: Tensor) -> None:
        """What the IDX format allows but the dataset does not: caught now, not as an odd failure at some later step."""
        problem = None
        if images.dim() != 3 or tuple(images.shape[1:]) != (28, 28):
            problem = f"the images are {'x'.join(map(str, images.shape[1:]))} pixels, not 28x28"
        elif len(images) == 0:
            problem = "they hold no images"
        elif len(images) != len(targets):
            problem = f"they disagree: {len(images)} images but {len(targets)} labels"
        elif targets.min() < 0 or targets.max() >= len(self.class_names):
            wrong = targets.min() if targets.min() < 0 else targets.max()
            problem = f"labels must be 0 to {len(self.class_names) - 1}, and one is {int(wrong)}"
        if problem:
            raise DataError(
                f"The {split} files in {self.raw_folder} are not {self.dataset_class.__name__}: {problem}."
                " Delete them and download or copy them again."
            )

    def _load_folder(self, folder: Path) -> BatchedTensorDataset:
        """The folder's images, as a dataset whose labels are unknown (-1). Files that are no image are skipped."""
        if not folder.is_dir():
            what = "is a file, not a folder" if folder.exists() else "no such folder"
            raise DataError(f"--data.predict_dir {folder}: {what}. Give a folder that holds image files.")
        images, skipped, too_large, blank = [], [], [], []
        for path in sorted(path for path in folder.iterdir() if path.is_file()):
            try:
                pixels = mnist_pixels(path)
            except Image.DecompressionBombError:  # a picture that could exhaust the memory to decode
                too_large.append(path.name)
                continue
            except (OSError, ValueError):  # PIL's "cannot identify image file", a truncated file, ...
                skipped.append(path.name)
                continue
            if not pixels.any():  # nothing drawn: any class the network gave it would mean nothing
                blank.append(path.name)
                continue
            images.append(torch.from_numpy(pixels))
            self.predict_files.append(path)
        if blank:
            rank_zero_info(
                f"Skipped {len(blank)} picture(s) of {folder} with nothing drawn on them: {', '.join(blank)}"
            )
        if skipped:
            rank_zero_info(
                f"Skipped {len(skipped)} file(s) of {folder} that are no readable image: {', '.join(skipped)}"
            )
        if too_large:
            rank_zero_info(
                f"Skipped {len(too_large)} picture(s) of {folder} with more pixels than Pillow decodes safely"
                f" ({Image.MAX_IMAGE_PIXELS // 1_000_000} million, its guard against decompression bombs):"
                f" {', '.join(too_large)}. Make them smaller to predict them."
            )
        if not images:
            said = " (each file was skipped, as said above)" if blank or skipped or too_large else ""
            if any(path.is_dir() for path in folder.iterdir()):
                said += " (its subfolders are not searched)"
            raise DataError(
                f"--data.predict_dir {folder} holds no picture to predict{said}: put PNG, JPEG or BMP files there."
            )
        return BatchedTensorDataset(torch.stack(images), torch.full((len(images),), -1))

    def train_dataloader(self) -> StatefulDataLoader:
        """Each rank's share of the epoch's shuffled training set, from a loader that can stop and resume mid-epoch.

        The sampler is Lightning's choice under DDP, a `DistributedSampler` seeded with the run's seed and reshuffled
        each epoch (`set_epoch`), that can also say how far the epoch has got (`datamodules/sampler.py`). torchdata's
        `StatefulDataLoader` puts that in every checkpoint Lightning saves, and gives it back on resume.
        """
        trainer = self.trainer
        sampler = ResumableDistributedSampler(
            self.train_set,
            num_replicas=trainer.world_size if trainer else 1,
            rank=trainer.global_rank if trainer else 0,
            seed=int(os.environ.get("PL_GLOBAL_SEED", 0)),  # the seed Lightning gives the samplers it injects
        )
        if trainer is not None:  # the epoch about to start (a run continued from an epoch's end: not 0), which
            # Lightning sets after it made the loader's iterator: with workers, the first batches were drawn before
            sampler.set_epoch(trainer.fit_loop.epoch_progress.current.processed)
        return self._loader(self.train_set, self.hparams.batch_size, sampler=sampler, loader_class=StatefulDataLoader)

    def val_dataloader(self) -> DataLoader:
        sampler = self._evaluation_sampler(self.val_set, f"--data.val_size {self.hparams.val_size}: the validation set")
        return self._loader(self.val_set, self.hparams.eval_batch_size, sampler=sampler)

    def test_dataloader(self) -> DataLoader:
        sampler = self._evaluation_sampler(self.test_set, "the test set")
        return self._loader(self.test_set, self.hparams.eval_batch_size, sampler=sampler)

    def predict_dataloader(self) -> DataLoader:
        # Lightning shards predictions without repeats already, and refuses a rank left without one (an assertion)
        dataset, processes = self.predict_set or self.test_set, self.trainer.world_size if self.trainer else 1
        if len(dataset) < processes:
            raise DataError(
                f"--data.predict_dir {self.hparams.predict_dir} holds {len(dataset)} picture(s) to predict, fewer than"
                f" the {processes} processes that would share them: predict them on at most {len(dataset)} (--devices"
                " times --num_nodes)."
            )
        return self._loader(dataset, self.hparams.eval_batch_size)

    def _evaluation_sampler(self, dataset: BatchedTensorDataset, named: str) -> UnrepeatedDistributedSampler | None:
        """Under DDP, give each rank every world_size-th sample, each sample to exactly one rank.

        Lightning's default, a DistributedSampler, pads the set with repeated samples until its size divides by the
        number of ranks, so 10,000 test images on 3 ranks would count 2 of them twice. Here ranks may get one sample
        (and so one batch) more than others; the torchmetrics states add up per sample, so the figures are exact
        and the same for any number of ranks. A set smaller than the ranks (`named`, as the user set it) is one line
        (Lightning's sampler fails an assertion, "a bug").
        """
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return None
        if len(dataset) < trainer.world_size:
            raise DataError(
                f"{named} holds {len(dataset)} image(s), fewer than the {trainer.world_size} processes that share it:"
                f" give it {trainer.world_size} or more, or evaluate on at most {len(dataset)} (--devices times"
                " --num_nodes)."
            )
        return UnrepeatedDistributedSampler(
            dataset, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False
        )

    def _loader(
        self, dataset: BatchedTensorDataset, batch_size: int, sampler=None, loader_class: type = DataLoader
    ) -> DataLoader:
        on_device = self.hparams.on_device and self.trainer is not None
        if on_device:  # the loader's own copy; the splits stay in host memory for the dashboard
            dataset = BatchedTensorDataset(*(t.to(self.trainer.strategy.root_device) for t in dataset.tensors))
        rank = self.trainer.global_rank if self.trainer else None  # None: Lightning's own guess
        return loader_class(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=self.hparams.num_workers,
            collate_fn=already_batched,
            pin_memory=self.hparams.pin_memory and not on_device,
            persistent_workers=self.hparams.num_workers > 0,
            worker_init_fn=partial(leave_stops_to_the_training_process, rank=rank),
        )

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the data, for a run that continues from it (`batch_size_to_continue`): the
        samples of one batch and of one optimizer step, over how many processes, and whether the epoch was left in
        the middle."""
        trainer = self.trainer
        world_size, accumulated = trainer.world_size, trainer.accumulate_grad_batches
        return {
            "global_batch_size": self.hparams.batch_size * world_size * accumulated,
            "world_size": world_size,
            "batch_size": self.hparams.batch_size,
            "inside_an_epoch": not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch,
        }

    def continue_from(self, state: dict[str, Any], world_size: int, accumulated: int, epoch: int) -> None:
        """Take the per-device batch a run continued from a checkpoint (`state`, of `epoch`) trains with on
        `world_size` processes (`batch_size_to_continue`; the batch size is chosen where it is not the run's), said
        in a line where it changes. train.py asks before the processes meet: a refused continuation changes nothing."""
        chosen = self.hparams.batch_size != state.get("batch_size", self.hparams.batch_size)
        batch_size = self.batch_size_to_continue(state, world_size, accumulated, chosen, epoch)
        if batch_size != self.hparams.batch_size:
            before = state["world_size"]
            rank_zero_info(
                f"Continuing a run of {before} process{'es' * (before != 1)} on {world_size}: per-device batch"
                f" {self.hparams.batch_size} -> {batch_size}, to keep the global batch of {state['global_batch_size']}."
            )
        self.hparams.batch_size = batch_size

    def batch_size_to_continue(
        self, state: dict[str, Any], world_size: int, accumulated: int, chosen: bool, epoch: int
    ) -> int:
        """The per-device batch a run continued from a checkpoint (`state`, of `epoch`) trains with on `world_size`
        processes; a `DataError` saying why there is none.

        Without a batch size `chosen` for the continuation, the global batch stays as it was on another number of
        processes too, and so the optimizer steps are made of the samples they would have been made of without the
        stop. In the middle of an epoch the samples of one batch over all processes must stay as they were, chosen
        or not: the sampler continues the epoch from the sample it had reached, but Lightning counts the epoch's
        batches on from where they were, and would end it early, or late, with batches of another size.
        """
        global_batch, saved_world_size = state.get("global_batch_size"), state.get("world_size")
        batch_size = self.hparams.batch_size
        if global_batch is None:
            return batch_size
        if not chosen and saved_world_size != world_size:
            per_step = world_size * accumulated  # per-device batches in one optimizer step
            if global_batch % per_step:
                fitting = [str(n) for n in range(1, global_batch + 1) if global_batch % (n * accumulated) == 0][:6]
                raise DataError(
                    f"the checkpoint's run took global batches of {global_batch} samples, which {world_size}"
                    f" processes x {accumulated} accumulated batches cannot share equally: continue it on"
                    f" {', '.join(fitting)}... processes in all (--devices x --num_nodes), or start a new run."
                )
            batch_size = global_batch // per_step
        before = state.get("batch_size", batch_size) * saved_world_size  # samples of one batch, all processes
        if state.get("inside_an_epoch") and batch_size * world_size != before:
            raise DataError(
                f"the run stopped in the middle of epoch {epoch}, whose batches took {before} samples over all"
                f" processes; it finishes that epoch with batches of as many ({batch_size} x {world_size} now)."
                f" Finish it first (--trainer.max_epochs {epoch + 1}, with --data.batch_size"
                f" {state.get('batch_size')} on {saved_world_size} process(es)), then change the batch."
            )
        return batch_size
