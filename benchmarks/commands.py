"""Whole commands, from Enter to the prompt: train.py against plain_ddp.py, or train.py commands against each other.

Each `NAME=COMMAND` runs once per round, in the order given, round after round (A B A B ...), so that the machine's
slow moments hit all of them; each in a fresh folder (what it writes goes with it), with `VAR=VALUE` words in front
as its environment (`OMP_NUM_THREADS=1 python ...`, as in a shell), `python` this interpreter and
a word that names a file or folder of the repository (`train.py`, `benchmarks/plain_ddp.py`, `configs/...`,
`../shared/datasets`) its absolute path. Per command: the median wall time (and the fastest and slowest round), the
median over rounds of its time over the first command's in the same round, and what its `Finished:` line reports
(train.py's summary; plain_ddp.py prints one like it). A train.py command given `--trainer.callbacks+=
benchmarks.commands.WarmClock` also reports its training time as a speed record measures it (`WarmClock`).

    python benchmarks/commands.py --rounds 3 \\
        "train.py=python train.py --data.dataset mnist --data.data_dir ../shared/datasets --trainer.max_epochs 2" \\
        "plain=python benchmarks/plain_ddp.py --dataset mnist --data-dir ../shared/datasets --epochs 2"
"""

import argparse
import datetime
import itertools
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback
from torch.func import functional_call

REPO = Path(__file__).resolve().parents[1]


class WarmClock(Callback):
    """The training time as a speed record measures it (tuomaso/train_mnist_fast: `%%timeit` of the training in a
    process that ran it before): the training steps alone, the device synchronised, the warm-up excluded.

    The warm-up a process pays once (loading the GPU's kernels, cuDNN choosing its algorithms) is paid before the
    clock starts, with `warmup_steps` steps of a copy of the model (its weights and buffers, run through its own
    forward, an optimizer of its kind) on the first batch of the training set: the weights trained and the order of
    the data stay those of a run without it. Then the clock runs from each epoch's start to its last step; what runs
    between epochs (validation, checkpoints, the dashboard) is left out. Rank 0 prints `warm training s: SECONDS`.

        python train.py ... --trainer.callbacks+=benchmarks.commands.WarmClock
    """

    def __init__(self, warmup_steps: int = 3) -> None:
        self.warmup_steps, self.seconds, self.started = warmup_steps, 0.0, None

    def on_train_start(self, trainer, pl_module) -> None:
        images, labels = (t[: trainer.datamodule.hparams.batch_size] for t in trainer.datamodule.train_set.tensors)
        images, labels = images.to(pl_module.device), labels.to(pl_module.device)
        tensors = itertools.chain(pl_module.named_parameters(), pl_module.named_buffers())
        twin = {name: t.detach().clone().requires_grad_(t.requires_grad) for name, t in tensors}
        kind = trainer.optimizers[0]
        optimizer = type(kind)([t for t in twin.values() if t.requires_grad], **kind.defaults)
        for _ in range(self.warmup_steps):
            F.cross_entropy(functional_call(pl_module, twin, (images,)), labels).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.started = self._now(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if batch_idx + 1 == trainer.num_training_batches or trainer.global_step == trainer.max_steps:
            self._stop(pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._stop(pl_module)
        if trainer.is_global_zero:
            print(f"warm training s: {self.seconds:.4f}", flush=True)

    def _stop(self, pl_module) -> None:
        if self.started is not None:
            self.seconds += self._now(pl_module) - self.started
            self.started = None

    @staticmethod
    def _now(pl_module) -> float:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("commands", nargs="+", metavar="NAME=COMMAND")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a command may run")
    args = parser.parse_args()
    commands = dict(command.split("=", 1) for command in args.commands)
    if len(commands) < len(args.commands) or not all(commands.values()):
        parser.error("give each command as NAME=COMMAND, each NAME once")
    print(machine())
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    for round_index in range(args.rounds):
        for name, command in commands.items():
            runs[name].append(run(command, args.timeout))
            said = "  ".join(f"{key} {value:g}" for key, value in runs[name][-1].items())
            print(f"round {round_index + 1}: {name}: {said}", file=sys.stderr, flush=True)
    print_table(commands, runs)
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")


def machine() -> str:
    import lightning

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return (
        f"{datetime.date.today()}, {platform.node()}: {len(os.sched_getaffinity(0))} CPU cores, {gpu}; Python"
        f" {platform.python_version()}, torch {torch.__version__}, Lightning {lightning.__version__}; load average"
        f" (1 min) {os.getloadavg()[0]:.2f}"
    )


def in_repo(word: str) -> str:
    """`word` (or the value of `--option=word`) as an absolute path where it names a file or folder of the repository
    (or beside it); `python` as this interpreter."""
    if word == "python":
        return sys.executable
    option, equals, value = word.rpartition("=") if word.startswith("-") else ("", "", word)
    if value and not value.startswith("-") and not os.path.isabs(value) and (REPO / value).exists():
        value = str((REPO / value).resolve())
    return f"{option}{equals}{value}"


def run(command: str, timeout: float) -> dict[str, float]:
    """Run one command in a fresh folder (`NAME=VALUE` words in front: its environment, as in a shell); its wall time
    and the figures its output reports."""
    words, env = shlex.split(command), {**os.environ}
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    words = [in_repo(word) for word in words]
    with tempfile.TemporaryDirectory() as folder:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        start = time.perf_counter()
        done = subprocess.run(words, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {shlex.join(words)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    figures = {"wall s": wall}
    output = done.stdout + done.stderr
    if finished := re.search(r"^Finished: (.+)$", output, re.MULTILINE):  # Finished: test/acc 0.9760  val/acc ...
        words = finished[1].split()
        figures |= {name: float(value) for name, value in zip(words[::2], words[1::2], strict=True)}
    if warm := re.search(r"warm training s: ([\d.]+)", output):  # WarmClock's (after a progress bar's \r, maybe)
        figures["warm training s"] = float(warm[1])
    return figures


def print_table(commands: dict[str, str], runs: dict[str, list[dict]]) -> None:
    first = next(iter(commands))
    figures = list(dict.fromkeys(key for name in runs for run in runs[name] for key in run if key != "wall s"))
    rounds = len(runs[first])
    print(f"\nWhole commands, {rounds} interleaved rounds; wall time: median (fastest-slowest); / {first}: median of")
    print("the rounds' ratios; the figures each reports: each round's")
    print(f"| command | wall s | / {first} |{''.join(f' {figure} |' for figure in figures)}")
    print(f"| --- | --- | --- |{' --- |' * len(figures)}")
    for name, command in commands.items():
        walls = [run["wall s"] for run in runs[name]]
        pairs = zip(runs[name], runs[first], strict=True)
        ratio = statistics.median(mine["wall s"] / theirs["wall s"] for mine, theirs in pairs)
        cells = [", ".join(f"{run[key]:g}" for run in runs[name] if key in run) for key in figures]
        print(
            f"| {name}: `{command}` | {statistics.median(walls):.1f} ({min(walls):.1f}-{max(walls):.1f}) |"
            f" {ratio:.2f} |{''.join(f' {cell} |' for cell in cells)}"
        )


if __name__ == "__main__":
    main()
