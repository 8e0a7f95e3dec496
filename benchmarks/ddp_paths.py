"""Training throughput of three data-parallel paths, side by side, on the same model, data and number of steps.

1. lightning: this project's model and datamodule under `Trainer(strategy="ddp")`, as train.py runs them
   (no logger, checkpoints or progress bar: the bare training loop).
2. plain: a hand-written PyTorch DDP loop, the reference Lightning itself checks parity against: same network,
   same uint8 batches normalised on the device by the model, `DistributedDataParallel`, `DistributedSampler`, Adam.
3. tutorial: the plain loop fed the tutorials' way: torchvision's MNIST with `ToTensor()` and `Normalize()` per
   sample (a PIL image per sample) through a `DataLoader` with a `DistributedSampler`.

Each (path, processes) pair runs as its own `torchrun` job; pairs are interleaved round by round so that machine
noise hits all paths alike, and the median over rounds is reported. Steady state only: the first `--warmup` steps
are not timed, nor is process start or data loading.

    python benchmarks/ddp_paths.py --data-dir ../shared/datasets --model SeqNet --devices 1 2
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PATHS = ("lightning", "plain", "tutorial")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(parser)
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2], help="processes per job")
    parser.add_argument("--steps", type=int, default=200, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--worker", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)  # JSON: see lightning_loop
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args)
    else:
        compare(args)


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark script shares: where the data is, which model, the batch per process."""
    parser.add_argument("--data-dir", default="../shared/datasets", help="folder holding MNIST/raw/")
    parser.add_argument("--model", default="SeqNet", choices=["SeqNet", "ConvNet"])
    parser.add_argument("--batch-size", type=int, default=64, help="per process")


def run_torchrun(devices: int, script: str, arguments: list[str], env: dict[str, str] | None = None) -> None:
    """Run `script arguments` as a torchrun job of `devices` processes on this machine, from the repository root.

    Every process gets the same threads, from the start: cores / processes, what Lightning and torchrun would choose.
    (Setting the count later, with torch.set_num_threads, gave other speeds on 2 cores.) `env` may override that.
    """
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={devices}"]
    threads = {"OMP_NUM_THREADS": str(max(1, os.cpu_count() // devices))}
    env = {**os.environ, **threads, **(env or {})}
    subprocess.run(
        [*command, script, *arguments], check=True, cwd=REPO, env=env, stdout=subprocess.DEVNULL, timeout=1800
    )


def compare(args: argparse.Namespace) -> None:
    """Run every (path, devices) job `rounds` times, interleaved, and print the table of medians."""
    results: dict[tuple[str, int], list[dict]] = {}
    for round_index in range(args.rounds):
        for devices in args.devices:
            for path in args.paths:
                results.setdefault((path, devices), []).append(run_job(args, path, devices))
                print(f"round {round_index + 1}: {path} x{devices} done", file=sys.stderr)
    print_table(args, results)


def run_job(args: argparse.Namespace, path: str, devices: int, options: dict | None = None) -> dict:
    """One torchrun job of `devices` processes on `path`; `options` change the Lightning path (see lightning_loop)."""
    options = options or {}
    with tempfile.TemporaryDirectory() as out:
        arguments = [
            *("--worker", path, "--out", out, "--data-dir", args.data_dir, "--model", args.model),
            *("--batch-size", str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup)),
            *("--options", json.dumps(options)),
        ]
        run_torchrun(devices, __file__, arguments, options.get("env"))
        ranks = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
    seconds = max(rank["seconds"] for rank in ranks)
    samples = args.steps * args.batch_size * devices
    return {
        "samples_per_s": samples / seconds,
        "samples_per_s_per_rank": samples / seconds / devices,
        "ms_per_step": 1000 * seconds / args.steps,
        "peak_mib_per_rank": max(rank["peak_mib"] for rank in ranks),
        "device": ranks[0]["device"],
    }


def print_table(args: argparse.Namespace, results: dict[tuple[str, int], list[dict]]) -> None:
    from datamodules import MNISTDataModule
    from datamodules.mnist import TRAIN_SET_SIZE

    train_size = TRAIN_SET_SIZE - MNISTDataModule().hparams.val_size
    print(
        f"\n{args.model}, batch {args.batch_size} per process, {args.steps} timed steps after {args.warmup}, "
        f"median of {args.rounds} rounds, device: {next(iter(results.values()))[0]['device']}"
    )
    print(
        "| path | processes | samples/s (total) | samples/s per rank | ms/step | epoch s (est.) | peak MiB/rank "
        "| vs plain | vs tutorial |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for devices in args.devices:
        median = {path: medians(results[(path, devices)]) for path in args.paths}
        for path in args.paths:
            m = median[path]
            epoch = train_size / (args.batch_size * devices) * m["ms_per_step"] / 1000
            vs = [
                f"{m['samples_per_s'] / median[ref]['samples_per_s']:.2f}" if ref in median else "-"
                for ref in ("plain", "tutorial")
            ]
            print(
                f"| {path} | {devices} | {m['samples_per_s']:,.0f} | {m['samples_per_s_per_rank']:,.0f} | "
                f"{m['ms_per_step']:.2f} | {epoch:.1f} | {m['peak_mib_per_rank']:.0f} | {vs[0]} | {vs[1]} |"
            )


def medians(runs: list[dict]) -> dict[str, float]:
    """The median over rounds of every figure `run_job` returns."""
    return {key: statistics.median(run[key] for run in runs) for key in runs[0] if key != "device"}


# ---------------------------------------------------------------- inside each torchrun process


def run_worker(args: argparse.Namespace) -> None:
    import torch

    if args.worker == "lightning":
        seconds, device = lightning_loop(args)
    else:
        seconds, device = plain_loop(args)
    rank = int(os.environ["RANK"])
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else _peak_rss_mib()
    Path(args.out, f"rank{rank}.json").write_text(json.dumps({"seconds": seconds, "peak_mib": peak, "device": device}))


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _device_name(torch_device) -> str:
    import torch

    return torch.cuda.get_device_name(torch_device) if torch_device.type == "cuda" else "cpu"


def _model(name: str, adam: dict | None = None, **options):
    """train.py's model with a constant learning rate, and its default optimizer (Adam, lr 0.01, fused) or, given
    `adam`, Adam with lr 0.01 and those keyword arguments instead."""
    import torch

    from models import ConvNet, SeqNet

    if adam is not None:
        options["optimizer"] = lambda params: torch.optim.Adam(params, lr=0.01, **adam)
    model_class = {"SeqNet": SeqNet, "ConvNet": ConvNet}[name]
    return model_class(one_cycle=False, **options)


def sync(device) -> None:
    """Wait for the device to finish its queued work (nothing to wait for on a CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer:
    """Times steps warmup+1 .. warmup+steps on the wall clock, synchronising the device only at the two ends."""

    def __init__(self, warmup: int, device) -> None:
        self.warmup, self.device, self.steps, self.start = warmup, device, 0, None

    def step_done(self) -> None:
        self.steps += 1
        if self.steps == self.warmup:
            sync(self.device)
            self.start = time.perf_counter()

    def seconds(self) -> float:
        sync(self.device)
        return time.perf_counter() - self.start


def lightning_loop(args: argparse.Namespace) -> tuple[float, str]:
    """The Lightning path. `--options` (JSON) may change it: "model" and "trainer" hold keyword arguments of the
    model class and the Trainer, "strategy" those of `DDPStrategy`, "data" those of the datamodule, "adam" those of
    Adam (instead of the model's default optimizer), "stop_every_n_steps" sets train.py's `--stop.every_n_steps`
    (`GracefulStop`'s check), "watchdog_timeout" its `--watchdog.timeout` (0: no `StallWatchdog`), and `run_job`
    puts "env" in the environment."""
    import torch.distributed as dist
    from lightning.pytorch import Callback
    from lightning.pytorch.strategies import DDPStrategy

    from benchmarks.bare_trainer import bare_trainer
    from datamodules import MNISTDataModule

    class TimeSteps(Callback):
        def on_train_start(self, trainer, pl_module):
            self.timer = StepTimer(args.warmup, pl_module.device)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.timer.step_done()

    options = json.loads(args.options)
    timing = TimeSteps()
    trainer = bare_trainer(
        strategy=DDPStrategy(**options.get("strategy", {})),
        accelerator="auto",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        max_steps=args.warmup + args.steps,
        callbacks=[timing],
        stop_every_n_steps=options.get("stop_every_n_steps", 50),
        watchdog_timeout=options.get("watchdog_timeout", 60),
        **options.get("trainer", {}),
    )
    datamodule = MNISTDataModule(
        dataset="mnist", data_dir=args.data_dir, batch_size=args.batch_size, **options.get("data", {})
    )
    trainer.fit(_model(args.model, options.get("adam"), **options.get("model", {})), datamodule=datamodule)
    seconds = timing.timer.seconds()
    if dist.is_initialized():  # as train.py does: else gloo's threads may abort the process at its exit
        dist.destroy_process_group()
    return seconds, _device_name(trainer.strategy.root_device)


def plain_loop(args: argparse.Namespace) -> tuple[float, str]:
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")  # threads: OMP_NUM_THREADS, set by run_torchrun
        dist.init_process_group("gloo")
    torch.manual_seed(42)
    loop = PlainLoop(args, device, tutorial=args.worker == "tutorial")
    loop.time_steps(args.warmup)
    seconds = loop.time_steps(args.steps)
    dist.destroy_process_group()
    return seconds, _device_name(device)


class PlainLoop:
    """The plain PyTorch DDP loop: `DistributedDataParallel`, a `DistributedSampler` re-shuffled every epoch, and
    the model's optimizer.

    Fed the project's way (uint8 batches from the datamodule's tensors, which the model normalises on the device)
    or, with `tutorial`, the tutorials' way (torchvision's MNIST, `ToTensor()` and `Normalize()` per sample, into
    the network alone). The model is `args.model`'s, or `module` (an `ImageClassifier`). Needs the process group.
    """

    def __init__(self, args: argparse.Namespace, device, tutorial: bool = False, module=None) -> None:
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DataLoader, DistributedSampler

        from datamodules import MNISTDataModule
        from datamodules.mnist import already_batched

        self.datamodule = MNISTDataModule(dataset="mnist", data_dir=args.data_dir, batch_size=args.batch_size)
        if tutorial:
            from torchvision import datasets, transforms

            to_tensor = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
            dataset = datasets.MNIST(args.data_dir, train=True, transform=to_tensor)
            collate = None
        else:
            self.datamodule.setup("fit")
            dataset, collate = self.datamodule.train_set, already_batched
        self.sampler = DistributedSampler(dataset, shuffle=True, seed=42)
        self.loader = DataLoader(dataset, batch_size=args.batch_size, sampler=self.sampler, collate_fn=collate)
        module = module or _model(args.model)
        module.configure_model()  # the model's own speed settings (channels_last), as Lightning applies them
        # The training set's statistics, as the model's `setup` takes them under Lightning.
        module.hparams.pixel_mean, module.hparams.pixel_std = self.datamodule.mean, self.datamodule.std
        # The whole module, so that its forward normalises the images and lays them out as the network wants
        # (channels_last); the tutorial's images come normalised, for the network alone.
        device_ids = [device.index] if device.type == "cuda" else None
        self.model = DistributedDataParallel((module.net if tutorial else module).to(device), device_ids=device_ids)
        self.optimizer = module.optimizer(self.model.parameters())  # the model's own: Adam, lr 0.01, fused
        self.device, self.tutorial, self.epoch, self.batches = device, tutorial, 0, iter(self.loader)

    def time_steps(self, steps: int) -> float:
        """Train `steps` steps; the wall time they took, the device synchronised at both ends."""
        import torch.nn.functional as F

        sync(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            images, targets = self._next_batch()
            images, targets = images.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)
            loss = F.cross_entropy(self.model(images), targets)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        sync(self.device)
        return time.perf_counter() - start

    def _next_batch(self):
        batch = next(self.batches, None)
        if batch is None:  # a new epoch, re-shuffled
            self.epoch += 1
            self.sampler.set_epoch(self.epoch)
            self.batches = iter(self.loader)
            batch = next(self.batches)
        return batch


if __name__ == "__main__":
    main()
