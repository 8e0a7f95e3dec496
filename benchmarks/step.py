"""The training step: train.py's (Lightning's loop) against plain_ddp.py's loop, in the same processes.

Each job is `python train.py fit ... --devices N`, as a user runs it, with one callback more (`Alternate`). After
`--warmup` untimed steps, chunks of `--chunk` of train.py's steps alternate with chunks of as many steps of the plain
loop, which trains a second copy of the model (its class, sizes, optimizer and the one-cycle schedule, the weights
copied) with `benchmarks/plain_ddp.py`'s data path and `train_step`, wrapped in its own `DistributedDataParallel`
over the process group Lightning made (none with one process, as Lightning does). Whatever slows the machine down
slows both kinds of chunk alike. A chunk is timed from the callback's hook of one step to its hook `--chunk` steps
later, the device synchronised at both ends: everything train.py runs per step is in it (its callbacks, logging every
50 steps, the stop check, the progress bar); a chunk across an epoch's end (validation, checkpoints) is left out.
The default chunk of 50 steps holds one logging step and one stop check each.

ms per step is each job's median chunk; the ratio is the median of train.py's chunks over the plain chunk after
each, per job and over all jobs' chunks together. `--bare` switches train.py's own pieces off (logger, checkpoints,
progress bar, summary, stop check, watchdog, dashboard): Lightning's loop nearly alone. `--options` adds train.py
options (a `--config`, say): the plain side takes the model, batch size and data from the run. It keeps the data in
host memory (plain_ddp.py's), so against `--data.on_device true` its step also copies each batch.

    python benchmarks/step.py --data-dir ../shared/datasets --model SeqNet --processes 1 2
    python benchmarks/step.py --data-dir DATA --accelerator gpu --processes 1 --model ConvNet --batch-size 512
"""

import argparse
import inspect
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback
from torch.nn.parallel import DistributedDataParallel

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import plain_ddp  # noqa: E402
from models import ImageClassifier  # noqa: E402

BARE = [  # train.py's pieces off: what PIECES in train.py says switches each off
    *("--trainer.logger", "false", "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false"),
    *("--trainer.enable_model_summary", "false", "--stop.every_n_steps", "0", "--watchdog.timeout", "0"),
    *("--dashboard.every_n_steps", "0", "--trainer.num_sanity_val_steps", "0"),
]


class Alternate(Callback):
    """In train.py's processes: chunks of its steps and of the plain loop's, in turn; rank 0 writes the times to
    `out` (JSON). Every process counts the same steps, so all switch together and join the same collectives."""

    def __init__(self, out: str, chunk: int = 50, warmup: int = 50) -> None:
        self.out, self.chunk, self.warmup = out, chunk, warmup
        self.steps, self.started, self.epoch = 0, None, 0
        self.seconds: dict[str, list[float]] = {"train.py": [], "plain": []}

    def on_train_start(self, trainer, pl_module: ImageClassifier) -> None:
        """The plain loop's model (a copy of the run's), optimizer, schedule and data."""
        data, device, hparams = trainer.datamodule.hparams, pl_module.device, pl_module.hparams
        shared = inspect.signature(ImageClassifier.__init__).parameters
        own = inspect.signature(type(pl_module).__init__).parameters  # the net's sizes: the subclass's own arguments
        sizes = {name: hparams[name] for name in own if name in hparams and name not in shared}
        statistics_ = {"pixel_mean": hparams.pixel_mean, "pixel_std": hparams.pixel_std}
        model = type(pl_module)(**sizes, **statistics_, channels_last=hparams.channels_last)
        model.configure_model()
        model.to(device)
        for mine, theirs in zip(model.parameters(), pl_module.parameters(), strict=True):
            mine.data = theirs.detach().clone()  # the run's weights, in their memory layout (clone keeps strides)
        world_size = trainer.world_size
        device_ids = [device.index] if device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=device_ids) if world_size > 1 else model
        self.optimizer = pl_module.optimizer(model.parameters())  # the run's optimizer (default: Adam, fused)
        cycle = hparams.cycle_momentum and "betas" in self.optimizer.defaults
        peak, total = self.optimizer.defaults["lr"], trainer.max_steps  # the plain loop takes fewer steps
        self.schedule = torch.optim.lr_scheduler.OneCycleLR(self.optimizer, peak, total, cycle_momentum=cycle)
        train_set, _, _ = plain_ddp.load(data.data_dir, data.dataset, data.val_size)
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        self.sampler, self.loader = plain_ddp.training_loader(
            train_set, data.batch_size, seed, trainer.global_rank, trainer.world_size
        )
        self.plain_epoch, self.batches = 0, iter(self.loader)
        self.device = device

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.steps += 1
        since = self.steps - self.warmup
        if since < 0 or since % self.chunk:
            return
        if since == 0:
            self._plain_steps(self.warmup)  # the plain loop's own warm-up
        else:
            seconds = self._now() - self.started
            if trainer.current_epoch == self.epoch:  # else validation and checkpoints ran within the chunk
                self.seconds["train.py"].append(seconds)
                self.seconds["plain"].append(self._plain_steps(self.chunk))
        self.epoch, self.started = trainer.current_epoch, self._now()

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_rank == 0:
            device = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "CPU"
            result = {"seconds": self.seconds, "chunk": self.chunk, "device": device}
            result |= {"processes": trainer.world_size, "threads": torch.get_num_threads()}
            Path(self.out).write_text(json.dumps(result))

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _plain_steps(self, steps: int) -> float:
        """`steps` steps of the plain loop (a new epoch as its loader runs out, `set_epoch` first); their seconds."""
        start = self._now()
        for _ in range(steps):
            batch = next(self.batches, None)
            if batch is None:
                self.plain_epoch += 1
                self.sampler.set_epoch(self.plain_epoch)
                self.batches = iter(self.loader)
                batch = next(self.batches)
            images, labels = (tensor.to(self.device) for tensor in batch)
            plain_ddp.train_step(self.model, self.optimizer, self.schedule, images, labels)
        return self._now() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/datasets", help="the folder that holds MNIST/raw/")
    parser.add_argument("--model", default="SeqNet", choices=["SeqNet", "ConvNet"])
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="a job of each, in turn")
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--chunk", type=int, default=50, help="steps per chunk")
    parser.add_argument(
        "--chunks", type=int, default=10, help="chunks of each kind per job (one across an epoch's end: left out)"
    )
    parser.add_argument("--warmup", type=int, default=50, help="untimed steps of each kind first")
    parser.add_argument("--rounds", type=int, default=1, help="jobs of each number of processes")
    parser.add_argument("--bare", action="store_true", help="train.py's own pieces off: Lightning's loop")
    parser.add_argument("--options", default="", help="more train.py options, after the others")
    args = parser.parse_args()
    results = {processes: [] for processes in args.processes}
    print(f"{time.strftime('%Y-%m-%d')}, load average (1 min) at the start: {os.getloadavg()[0]:.2f}")
    for _ in range(args.rounds):
        for processes in args.processes:
            results[processes].append(run_job(args, processes))
    print_table(args, results)
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")


def run_job(args: argparse.Namespace, processes: int) -> dict:
    """One `train.py fit` job of `processes` processes with `Alternate`; rank 0's times."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder, "steps.json")
        command = [
            *(sys.executable, str(REPO / "train.py"), "fit", "--model", args.model, "--data.dataset", "mnist"),
            *("--data.data_dir", str(Path(args.data_dir).resolve()), "--data.batch_size", str(args.batch_size)),
            *("--devices", str(processes), "--trainer.accelerator", args.accelerator),
            *("--trainer.default_root_dir", folder, "--trainer.max_steps", str(args.warmup + args.chunks * args.chunk)),
            *(BARE if args.bare else []),
            *shlex.split(args.options),
            *("--trainer.callbacks+=benchmarks.step.Alternate", f"--trainer.callbacks.out={out}"),
            *(f"--trainer.callbacks.chunk={args.chunk}", f"--trainer.callbacks.warmup={args.warmup}"),
        ]
        run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800)
        if run.returncode != 0 or not out.exists():
            sys.exit(f"failed ({run.returncode}): {shlex.join(command)}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}")
        result = json.loads(out.read_text())
    print(f"{processes} processes: {json.dumps(summary(result))}", file=sys.stderr, flush=True)
    return result


def summary(result: dict) -> dict[str, float]:
    """ms per step of each kind (the median chunk), and the median of train.py's chunk over the plain one after it."""
    ms = {kind: 1000 * statistics.median(times) / result["chunk"] for kind, times in result["seconds"].items()}
    return {**ms, "ratio": statistics.median(ratios(result)), "chunks": len(ratios(result))}


def ratios(result: dict) -> list[float]:
    """Each of train.py's chunks over the plain chunk after it."""
    return [ours / plain for ours, plain in zip(result["seconds"]["train.py"], result["seconds"]["plain"], strict=True)]


def print_table(args: argparse.Namespace, results: dict[int, list[dict]]) -> None:
    first = next(iter(results.values()))[0]
    what = "train.py's pieces off (--bare)" if args.bare else "train.py as run"
    print(
        f"\n{args.model}, batch {args.batch_size} per process, {first['device']}, {what}"
        f"{', options: ' + args.options if args.options else ''}; chunks of {args.chunk} steps, medians"
    )
    print("| processes | threads each | train.py ms/step | plain loop ms/step | train.py / plain | all | chunks |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for processes, jobs in results.items():
        rows = [summary(job) for job in jobs]
        cells = [", ".join(f"{row[key]:.2f}" for row in rows) for key in ("train.py", "plain", "ratio")]
        pooled = statistics.median(ratio for job in jobs for ratio in ratios(job))
        chunks = sum(row["chunks"] for row in rows)
        print(f"| {processes} | {jobs[0]['threads']} | {' | '.join(cells)} | {pooled:.2f} | {chunks} |")


if __name__ == "__main__":
    main()
