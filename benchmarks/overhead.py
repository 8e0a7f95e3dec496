"""Lightning's cost per training step against the plain DDP loop, measured inside the same processes.

`ddp_paths.py` times each path in a job of its own; on a noisy machine the ratio of two jobs moves by 10% from
one run to the next, more than the difference it should show. Here one torchrun job runs both: chunks of
`--chunk` steps of the Lightning path (train.py's model, datamodule and step callbacks under `Trainer(strategy=
"ddp")`) alternate with chunks of the plain loop of `ddp_paths.py` (its own copy of the model, its own
`DistributedDataParallel`, sampler and Adam, over the same process group), so that whatever slows the machine
down slows both. Every other Lightning chunk runs train.py's stop check (`GracefulStop`: stop signals and a
non-finite loss, one all-reduce) after every step, as often as Lightning's own SIGTERM broadcast, which it replaces
(`--stop.every_n_steps 1`), instead of every 50. The median chunk of each kind gives ms per step.

A second table splits the step: the work both paths share (the model's forward with the normalisation, the loss,
autograd's backward with DDP's all-reduce, Adam's update, building the batch) is timed where each path calls it; the
rest is each loop's own code with what it calls around that work (DDP's forward wrapper, the optimizer's step wrapper,
the DataLoader's iteration). On a GPU these are host times: the device is not synchronised around each piece.

    python benchmarks/overhead.py --data-dir ../shared/datasets --model SeqNet --devices 2 --batch-size 64
"""

import argparse
import functools
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from lightning.pytorch import Callback

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.callbacks.graceful_stop import GracefulStop  # noqa: E402
from benchmarks.ddp_paths import PlainLoop, _device_name, _model, add_data_arguments, run_torchrun, sync  # noqa: E402
from datamodules import MNISTDataModule  # noqa: E402
from datamodules.mnist import BatchedTensorDataset  # noqa: E402
from models.base import ImageClassifier  # noqa: E402

KINDS = {
    "plain": "plain PyTorch DDP loop",
    "lightning": "Lightning, train.py's defaults",
    "lightning_stop_every_step": "Lightning, `--stop.every_n_steps 1`",
}
# The work both paths share, as (owner, attribute): each path reaches it through that attribute.
SHARED_WORK = {
    "forward": (ImageClassifier, "forward"),
    "loss": (torch.nn.functional, "cross_entropy"),
    "backward": (torch.autograd, "backward"),  # Tensor.backward calls it; DDP's all-reduce runs inside
    "Adam": (importlib.import_module("torch.optim.adam"), "adam"),  # Adam.step's update, after the closure
    "batch": (BatchedTensorDataset, "__getitems__"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(parser)
    parser.add_argument("--devices", type=int, default=2, help="processes")
    parser.add_argument("--chunk", type=int, default=10, help="steps per chunk")
    parser.add_argument("--chunks", type=int, default=30, help="Lightning chunks per job (as many plain ones)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed Lightning steps first")
    parser.add_argument("--rounds", type=int, default=3, help="jobs")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args)
        return
    rounds = [run_job(args) for _ in range(args.rounds)]
    print_table(args, rounds)


def run_job(args: argparse.Namespace) -> dict:
    """One torchrun job; returns rank 0's median ms per step of each kind, and the device."""
    with tempfile.TemporaryDirectory() as out:
        arguments = [
            *("--worker", "--out", out, "--data-dir", args.data_dir, "--model", args.model),
            *("--batch-size", str(args.batch_size), "--chunk", str(args.chunk), "--chunks", str(args.chunks)),
            *("--warmup", str(args.warmup)),
        ]
        run_torchrun(args.devices, __file__, arguments)
        result = json.loads(Path(out, "rank0.json").read_text())
    print(f"round done: {json.dumps(result)}", file=sys.stderr)
    return result


def print_table(args: argparse.Namespace, rounds: list[dict]) -> None:
    print(
        f"\n{args.model}, batch {args.batch_size} per process, {args.devices} processes, chunks of {args.chunk} "
        f"steps, {args.chunks} of each kind per job, medians over {args.rounds} jobs, device: {rounds[0]['device']}"
    )
    print("| path | ms/step | vs plain (per job) | vs plain (median) |")
    print("| --- | --- | --- | --- |")
    for kind, label in KINDS.items():
        per_job = [r["plain"] / r[kind] for r in rounds]
        ms = statistics.median(r[kind] for r in rounds)
        print(f"| {label} | {ms:.2f} | {', '.join(f'{x:.2f}' for x in per_job)} | {statistics.median(per_job):.2f} |")
    print("\nWhere a step's time goes, ms per step (means over each job, medians over jobs)")
    print(f"| path | step | {' | '.join(SHARED_WORK)} | rest |")
    print(f"| --- | --- | {' | '.join('---' for _ in SHARED_WORK)} | --- |")
    for kind, label in KINDS.items():
        parts = ["step", *SHARED_WORK, "rest"]
        ms = [statistics.median(r["phases"][kind][part] for r in rounds) for part in parts]
        print(f"| {label} | {' | '.join(f'{x:.2f}' for x in ms)} |")


# ---------------------------------------------------------------- inside each torchrun process


def run_worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from lightning.pytorch.strategies import DDPStrategy

    from benchmarks.bare_trainer import bare_trainer

    alternate = Alternate(args)
    trainer = bare_trainer(
        strategy=DDPStrategy(),
        accelerator="auto",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        max_steps=args.warmup + 2 * args.chunks * args.chunk,
        callbacks=[alternate],
    )
    datamodule = MNISTDataModule(dataset="mnist", data_dir=args.data_dir, batch_size=args.batch_size)
    trainer.fit(_model(args.model), datamodule=datamodule)
    if trainer.global_rank == 0:
        chunks = alternate.chunks.items()
        result = {kind: 1000 * statistics.median(seconds) / args.chunk for kind, seconds in chunks}
        result["phases"] = {kind: alternate.clock.ms_per_step(kind, seconds, args.chunk) for kind, seconds in chunks}
        result["device"] = _device_name(trainer.strategy.root_device)
        Path(args.out, "rank0.json").write_text(json.dumps(result))
    if dist.is_initialized():  # as train.py does: else gloo's threads may abort the process at its exit
        dist.destroy_process_group()


class Alternate(Callback):
    """After every chunk of Lightning steps, time a chunk of plain steps; switch the stop check's interval every
    chunk.

    All ranks count the same steps, so they switch together and take part in the same collectives.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.chunks: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.steps, self.kind, self.start = 0, None, 0.0
        self.clock = SharedWorkClock()

    def on_train_start(self, trainer, pl_module) -> None:
        self.plain = PlainLoop(self.args, pl_module.device)
        self.stop = next(c for c in trainer.callbacks if isinstance(c, GracefulStop))  # bare_trainer's
        self.default_every_n_steps = self.stop.every_n_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps += 1
        since_warmup = self.steps - self.args.warmup
        if since_warmup < 0 or since_warmup % self.args.chunk:
            return
        if self.kind is not None:
            sync(pl_module.device)
            self.chunks[self.kind].append(time.perf_counter() - self.start)
            self.clock.kind = "plain"
            self.chunks["plain"].append(self.plain.time_steps(self.args.chunk))
        chunk_index = since_warmup // self.args.chunk
        self.kind = "lightning" if chunk_index % 2 == 0 else "lightning_stop_every_step"
        self.clock.kind = self.kind
        self.stop.every_n_steps = self.default_every_n_steps if self.kind == "lightning" else 1
        sync(pl_module.device)
        self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        self.clock.kind = None  # the last chunk, cut short by max_steps, is not counted


class SharedWorkClock:
    """Wraps each entry of SHARED_WORK with a timer that adds its wall time to the chunk kind running now.

    The first of a Lightning chunk's steps is fetched in the step before it (Lightning prefetches one batch), so a
    chunk's `batch` time is that of the steps fetched during it: the same number.
    """

    def __init__(self) -> None:
        self.kind: str | None = None
        self.seconds: dict[str, Counter] = {kind: Counter() for kind in KINDS}
        for name, (owner, attribute) in SHARED_WORK.items():
            setattr(owner, attribute, self._timed(name, getattr(owner, attribute)))

    def _timed(self, name: str, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            kind, start = self.kind, time.perf_counter()
            result = function(*args, **kwargs)
            if kind is not None:
                self.seconds[kind][name] += time.perf_counter() - start
            return result

        return timed

    def ms_per_step(self, kind: str, chunk_seconds: list[float], chunk: int) -> dict[str, float]:
        """Mean ms per step of the whole step, of each piece of shared work, and of the rest."""
        steps = len(chunk_seconds) * chunk
        ms = {name: 1000 * self.seconds[kind][name] / steps for name in SHARED_WORK}
        ms["step"] = 1000 * sum(chunk_seconds) / steps
        ms["rest"] = ms["step"] - sum(ms[name] for name in SHARED_WORK)
        return ms


if __name__ == "__main__":
    main()
