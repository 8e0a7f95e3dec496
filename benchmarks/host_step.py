"""The host's time per training step, with a model whose compute is negligible: what the Python of each loop costs.

One linear layer (784 -> 10) at batch 1, in one torchrun job, five loops over the same process group, round after
round (plain, bare, defaults, train.py, Lightning's part, plain, ...), so that whatever slows the machine down slows
them all:

- plain: the plain PyTorch DDP loop of `ddp_paths.py` (DataLoader, `DistributedDataParallel`, Adam);
- bare: `Trainer(strategy="ddp")` with no logger, no callbacks, no progress bar, no checkpoints;
- defaults: `Trainer(strategy="ddp")` with Lightning's own defaults, what any Lightning program runs unless it
  switches them off: a TensorBoard logger, a progress bar refreshed at every step, a checkpoint callback, the model
  summary;
- train.py: train.py's own Trainer, built by its command line (`TrainCLI`, `fit`): its callbacks, logger, metrics
  and progress bar, as a user runs it;
- Lightning's part: the same Trainer with the project's callbacks taken out for the timed steps (`StepClock`), so
  that train.py minus this loop is all the project's callbacks cost, Lightning's calls into them included, and this
  loop minus the bare one is what the logger (Lightning's TensorBoard logger, under the project's small `RunLogger`),
  Lightning's progress bar and Lightning's callbacks cost as train.py sets them. It always runs right after
  train.py's loop.

On a shared machine a round can take twice as long as the next; the fastest round of each loop, the one least
disturbed, is printed beside the median. Each Lightning round is a `fit` of `--warmup` + `--steps` steps; the steps
after the warm-up are timed from one `on_train_batch_start` to the next (logging steps included: every
`log_every_n_steps`). The median round of each loop gives ms per step, and the median of the rounds' differences
compares two loops (each round runs them back to back). Then one more `fit` of the bare loop and one of train.py's,
under Lightning's `SimpleProfiler`, says per hook and per callback where
train.py's extra time goes (ms per step in train.py's Trainer minus the bare one's, for the actions both have, and in
full for the actions only train.py's has), and whose each callback is.

    python benchmarks/host_step.py --data-dir ../shared/datasets --devices 2
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.ddp_paths import run_torchrun  # noqa: E402
from models import ImageClassifier  # noqa: E402

OWN_CODE = ("app.", "datamodules.", "models.")  # the project's modules, as against Lightning's
LOOPS = {
    "plain": "plain PyTorch DDP loop",
    "bare": "bare Lightning Trainer",
    "defaults": "Lightning Trainer with its defaults (logger, progress bar, checkpoint)",
    "train.py": "train.py's Trainer",
    "lightning": "train.py's Trainer without the project's callbacks (Lightning's part)",
}


class OneLinear(ImageClassifier):
    """One linear layer: a step whose compute is a few microseconds, so that what is timed is the loop's Python."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))


class StepClock(Callback):
    """The wall time from the first timed step's start to the last one's end, and how many steps that was;
    `lightning_only`: the project's callbacks taken out of the Trainer from the first step to the end of training
    (set up and torn down as usual)."""

    def __init__(self, warmup: int, lightning_only: bool = False) -> None:
        self.warmup, self.batches, self.start, self.seconds, self.steps = warmup, 0, 0.0, 0.0, 0
        self.lightning_only, self.taken_out = lightning_only, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if self.batches == 0 and self.lightning_only:
            self.taken_out = [c for c in trainer.callbacks if type(c).__module__.startswith(OWN_CODE)]
            trainer.callbacks = [c for c in trainer.callbacks if c not in self.taken_out]
        if self.batches == self.warmup:
            self.start = time.perf_counter()
        self.batches += 1

    def on_train_end(self, trainer, pl_module) -> None:
        trainer.callbacks += self.taken_out  # in place: Lightning's loop over this hook reaches them too, then teardown

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.batches > self.warmup:
            self.seconds, self.steps = time.perf_counter() - self.start, self.batches - self.warmup

    def ms_per_step(self) -> float:
        return 1000 * self.seconds / self.steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/datasets", help="folder holding MNIST/raw/")
    parser.add_argument("--devices", type=int, default=1, help="processes")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first, in every round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args)
        return
    with tempfile.TemporaryDirectory() as out:
        arguments = ["--worker", "--out", out, "--data-dir", args.data_dir, "--steps", str(args.steps)]
        run_torchrun(args.devices, __file__, [*arguments, "--warmup", str(args.warmup), "--rounds", str(args.rounds)])
        print_tables(args, json.loads(Path(out, "rank0.json").read_text()))


def print_tables(args: argparse.Namespace, result: dict) -> None:
    print(
        f"\nOne linear layer, batch 1, {args.devices} processes (torchrun), {args.rounds} rounds of {args.steps}"
        f" timed steps per loop, interleaved, medians; torch {torch.__version__}, CPU"
    )
    plain = statistics.median(result["plain"])
    print("| loop | ms/step | fastest round | per round | vs plain (speed) |")
    print("| --- | --- | --- | --- | --- |")
    for loop, label in LOOPS.items():
        ms, rounds = statistics.median(result[loop]), result[loop]
        print(
            f"| {label} | {ms:.3f} | {min(rounds):.3f} | {', '.join(f'{x:.3f}' for x in rounds)} | {plain / ms:.2f}x |"
        )
    pairs = (("train.py", "bare"), ("train.py", "lightning"), ("lightning", "bare"), ("defaults", "bare"))
    for loop, base in (*pairs, ("train.py", "defaults")):
        extra = statistics.median(result[loop]) - statistics.median(result[base])
        paired = statistics.median(ours - theirs for ours, theirs in zip(result[loop], result[base], strict=True))
        fastest = min(result[loop]) - min(result[base])
        print(
            f"\n{LOOPS[loop]} over {LOOPS[base]}: {extra:+.3f} ms per step (median of the rounds' differences"
            f" {paired:+.3f}, fastest rounds {fastest:+.3f})",
            end="",
        )
    print()
    print("\nWhere it goes (SimpleProfiler, one fit of each; ms per step; a callback's row sums its hooks):")
    print("| action | whose | train.py's Trainer | bare Trainer | difference |")
    print("| --- | --- | --- | --- | --- |")
    for action, ours, bare, owner in result["split"]:
        if abs(ours - bare) >= 0.002:
            print(f"| `{action}` | {owner} | {ours:.3f} | {bare:.3f} | {ours - bare:+.3f} |")
    for owner in ("project", "Lightning"):
        rows = [(action, ours) for action, ours, _bare, whose in result["split"] if whose == owner]
        names = ", ".join(dict.fromkeys(action.removeprefix("[Callback]").split("{")[0] for action, _ in rows))
        whose = "The project's" if owner == "project" else "Lightning's"
        print(f"\n{whose} callbacks in train.py's Trainer: {sum(ms for _, ms in rows):.3f} ms per step ({names})")


# ---------------------------------------------------------------- inside each torchrun process


def run_worker(args: argparse.Namespace) -> None:
    from benchmarks.ddp_paths import PlainLoop

    torch.distributed.init_process_group("gloo")
    data = argparse.Namespace(data_dir=args.data_dir, batch_size=1)
    plain = PlainLoop(data, torch.device("cpu"), module=OneLinear(one_cycle=False))  # Adam, lr 0.01, fused
    root = Path(args.out, "runs")
    times: dict[str, list[float]] = {loop: [] for loop in LOOPS}
    for _ in range(args.rounds):
        plain.time_steps(args.warmup)
        times["plain"].append(1000 * plain.time_steps(args.steps) / args.steps)
        times["bare"].append(clock_of(bare_fit(args)).ms_per_step())
        times["defaults"].append(clock_of(default_fit(args, root)).ms_per_step())
        times["train.py"].append(clock_of(train_py_fit(args, root)).ms_per_step())
        times["lightning"].append(clock_of(train_py_fit(args, root, lightning_only=True)).ms_per_step())
    split = profiled_split(args, root)
    if torch.distributed.get_rank() == 0:
        Path(args.out, "rank0.json").write_text(json.dumps({**times, "split": split}))
    if torch.distributed.is_initialized():  # as train.py does: else gloo's threads may abort the process at exit
        torch.distributed.destroy_process_group()


def bare_fit(args: argparse.Namespace, profiler=None) -> Trainer:
    from benchmarks.bare_trainer import bare_trainer
    from datamodules import MNISTDataModule

    trainer = bare_trainer(
        stop_every_n_steps=None,  # no callback of train.py's
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        max_steps=args.warmup + args.steps,
        num_sanity_val_steps=0,
        callbacks=[StepClock(args.warmup)],
        profiler=profiler,
    )
    trainer.fit(OneLinear(), datamodule=MNISTDataModule(dataset="mnist", data_dir=args.data_dir, batch_size=1))
    return trainer


def default_fit(args: argparse.Namespace, root: Path) -> Trainer:
    """`Trainer(strategy="ddp")` as Lightning builds it by default, plus the clock."""
    from datamodules import MNISTDataModule

    trainer = Trainer(
        strategy="ddp",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        max_steps=args.warmup + args.steps,
        num_sanity_val_steps=0,
        default_root_dir=root / "defaults",
        callbacks=[StepClock(args.warmup)],
    )
    trainer.fit(OneLinear(), datamodule=MNISTDataModule(dataset="mnist", data_dir=args.data_dir, batch_size=1))
    return trainer


def train_py_fit(
    args: argparse.Namespace, root: Path, profiler: str | None = None, lightning_only: bool = False
) -> Trainer:
    """train.py's `fit`, as its command line builds it, plus the clock (and a profiler)."""
    from train import TrainCLI

    options = ["--model", "benchmarks.host_step.OneLinear", "--data.dataset", "mnist", "--data.batch_size", "1"]
    options += ["--data.data_dir", args.data_dir, "--trainer.default_root_dir", str(root)]
    options += ["--trainer.max_steps", str(args.warmup + args.steps), "--trainer.num_sanity_val_steps", "0"]
    options += ["--trainer.callbacks+=benchmarks.host_step.StepClock", "--trainer.callbacks.warmup", str(args.warmup)]
    options += ["--trainer.callbacks.lightning_only", str(lightning_only).lower()]
    options += ["--trainer.profiler", profiler] if profiler else []
    return TrainCLI(["fit", *options]).trainer


def clock_of(trainer: Trainer) -> StepClock:
    """The clock (by name: train.py's parser builds it from `benchmarks.host_step`, this file runs as `__main__`)."""
    return next(callback for callback in trainer.callbacks if type(callback).__name__ == "StepClock")


def profiled_split(args: argparse.Namespace, root: Path) -> list[tuple[str, float, float, str]]:
    """Lightning's SimpleProfiler over one fit of each Lightning loop: ms per step of each callback (all its hooks
    together) and of each other action that runs at every step, in train.py's Trainer and in the bare one, largest
    difference first, with whose code each is (`_owner`). Each profiled call costs about a microsecond of its own:
    compare rows, not the sum."""
    from lightning.pytorch.profilers import SimpleProfiler

    ours = train_py_fit(args, root, profiler="simple")
    profiles = [bare_fit(args, profiler=SimpleProfiler()).profiler.recorded_durations, ours.profiler.recorded_durations]
    own = {type(callback).__name__ for callback in ours.callbacks if type(callback).__module__.startswith(OWN_CODE)}
    steps = args.warmup + args.steps
    rows: dict[str, list[float]] = {}
    for column, durations in enumerate(profiles):
        for action, seconds in durations.items():
            per_step = len(seconds) >= steps // 50  # at every step, or every logging step: not setup, not an epoch's
            if not per_step or "run_training_epoch" in action or "run_training_batch" in action:
                continue
            name = action.split("}")[0] + "}" if action.startswith("[Callback]ModelCheckpoint") else action
            name = name.rsplit(".", 1)[0] if name.startswith("[Callback]") else name  # a callback: all its hooks
            rows.setdefault(name, [0.0, 0.0])[1 - column] += 1000 * sum(seconds) / steps
    rows = sorted(rows.items(), key=lambda row: row[1][1] - row[1][0])
    return [(name, mine, bare, _owner(name, own)) for name, (mine, bare) in rows]


def _owner(action: str, own: set[str]) -> str:
    """Whose code a row of the split is: the project's callbacks, Lightning's callbacks, the clock, or the loop."""
    if not action.startswith("[Callback]"):
        return "loop"
    name = action.removeprefix("[Callback]").split("{")[0]
    return "clock" if name == "StepClock" else "project" if name in own else "Lightning"


if __name__ == "__main__":
    main()
