"""The training step with the data on the device: what the device can do, and what train.py's step costs beside it.

One process (a torchrun job of one), the training split held on the device, round after round of these loops,
each timed over `--steps` steps after `--warmup`, the device synchronised at both ends; in the Lightning loops only
the steps are timed (`warm_clock.TrainingClock`), not what runs between two epochs (checkpoints, the dashboard):

- plain: the anchor, a plain PyTorch loop. The model's forward (its normalisation included), cross-entropy,
  backward, fused Adam and the one-cycle schedule; each epoch a permutation drawn on the device and the split
  gathered in that order once, then batches sliced from it: no DataLoader, no per-step copy, no DDP (one process
  has nothing to all-reduce);
- graphed: the same step captured once in a CUDA graph (forward, backward and a capturable Adam, a constant rate)
  and replayed, each batch copied into the graph's input first: the host's work per step is one launch, so what is
  left is the device's own time;
- bare: `Trainer(strategy="ddp")` with nothing that does not train (`bare_trainer.py`), train.py's datamodule
  with `on_device`;
- bare, one device: the same with `strategy="auto"` (no DDP wrapper, no all-reduce);
- train.py: train.py's `fit` as its command line builds it, `--data.on_device true`;
- train.py, one device: the same with `--trainer.strategy auto`, as `configs/convnet_fast_gpu.yaml` runs it;
- train.py, CUDA graph: that with `--model.cuda_graph true` (the network's forward and backward replayed as graphs).

For ConvNet's defaults and for the net of `--config` (its `model.init_args`, read from the YAML), at
`--batch-size`. On a CPU it runs too (for checking the script), with the data in host memory and no graphed loop.

    python benchmarks/device_step.py --data-dir ../shared/datasets --config configs/convnet_fast_gpu.yaml
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.ddp_paths import run_torchrun, sync  # noqa: E402
from benchmarks.warm_clock import TrainingClock  # noqa: E402

LOOPS = ("plain", "graphed", "bare", "bare, one device", "train.py", "train.py, one device", "train.py, CUDA graph")
NET_OPTIONS = ("channels", "kernel_sizes", "hidden", "batch_norm")  # ConvNet's size; the rest is how it trains


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/datasets", help="folder holding MNIST/raw/")
    parser.add_argument("--config", default="configs/convnet_fast_gpu.yaml", help="a config whose net to time too")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=200, help="timed steps per loop and round")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps first, in every loop and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args)
        return
    with tempfile.TemporaryDirectory() as out:
        options = ["--data-dir", str(Path(args.data_dir).resolve()), "--config", str(Path(args.config).resolve())]
        options += ["--batch-size", str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup)]
        run_torchrun(1, __file__, ["--worker", "--out", out, *options, "--rounds", str(args.rounds)])
        print_table(args, json.loads(Path(out, "result.json").read_text()))


def print_table(args: argparse.Namespace, result: dict) -> None:
    print(
        f"\n{result['device']}; torch {result['torch']}, Lightning {result['lightning']}; batch {args.batch_size},"
        f" {args.rounds} rounds of {args.steps} timed steps per loop, interleaved; ms per step, median (fastest round)"
    )
    ratios = "train.py / plain | train.py / bare | train.py, one device / plain | train.py, CUDA graph / plain"
    print(f"| net | {' | '.join(LOOPS)} | {ratios} |")
    print(f"| --- |{' --- |' * (len(LOOPS) + 4)}")
    for net, times in result["nets"].items():
        ms = {loop: statistics.median(rounds) for loop, rounds in times.items() if rounds}
        cells = [f"{ms[loop]:.2f} ({min(times[loop]):.2f})" if loop in ms else "" for loop in LOOPS]
        print(
            f"| {net} | {' | '.join(cells)} | {ms['train.py'] / ms['plain']:.2f} | {ms['train.py'] / ms['bare']:.2f}"
            f" | {ms['train.py, one device'] / ms['plain']:.2f} |"
            + (f" {ms['train.py, CUDA graph'] / ms['plain']:.2f} |" if "train.py, CUDA graph" in ms else " |")
        )


# ---------------------------------------------------------------- inside the torchrun process


def run_worker(args: argparse.Namespace) -> None:
    """Every loop for each net, round after round, in this process; the figures to `--out`/result.json."""
    import lightning

    from datamodules import MNISTDataModule

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    datamodule = MNISTDataModule(dataset="mnist", data_dir=args.data_dir)
    datamodule.setup("fit")
    images, targets = (tensor.to(device) for tensor in datamodule.train_set.tensors)
    statistics_ = (datamodule.mean, datamodule.std)
    config_net = yaml.safe_load(Path(args.config).read_text())["model"]["init_args"]
    nets = {
        "ConvNet (defaults)": {},
        f"ConvNet of {Path(args.config).name}": {key: value for key, value in config_net.items() if key in NET_OPTIONS},
    }
    times = {net: {loop: [] for loop in LOOPS} for net in nets}
    root = Path(args.out, "runs")
    for _ in range(args.rounds):
        for net, sizes in nets.items():
            times[net]["plain"].append(plain_loop(args, sizes, statistics_, images, targets))
            if device.type == "cuda":
                time_on_the_gpu(times[net], "graphed", partial(graphed_loop, args, sizes, statistics_, images, targets))
            times[net]["bare"].append(bare_fit(args, sizes, strategy="ddp"))
            times[net]["bare, one device"].append(bare_fit(args, sizes, strategy="auto"))
            times[net]["train.py"].append(train_py_fit(args, sizes, root, strategy="ddp"))
            times[net]["train.py, one device"].append(train_py_fit(args, sizes, root, strategy="auto"))
            if device.type == "cuda":
                graphed_fit = partial(train_py_fit, args, sizes, root, "auto", "--model.cuda_graph", "true")
                time_on_the_gpu(times[net], "train.py, CUDA graph", graphed_fit)
    result = {"nets": times, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"}
    result |= {"torch": torch.__version__, "lightning": lightning.__version__}
    Path(args.out, "result.json").write_text(json.dumps(result))


def time_on_the_gpu(times: dict[str, list[float]], loop: str, measure) -> None:
    """Add `measure()` to the loop's figures. One chance on a lent machine: the other loops' figures must come back
    even if a loop that only a GPU runs fails, so its error is said and the round goes on."""
    try:
        times[loop].append(measure())
    except Exception as error:  # noqa: BLE001
        print(f"{loop} failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)


def new_model(sizes: dict, statistics_: tuple[float, float], device, **options):
    """ConvNet of these sizes, its speed settings applied and the training set's statistics given, on the device."""
    from models import ConvNet

    model = ConvNet(**sizes, pixel_mean=statistics_[0], pixel_std=statistics_[1], **options)
    model.configure_model()
    return model.to(device)


def plain_loop(args, sizes, statistics_, images, targets) -> float:
    """ms per step of the anchor loop (module docstring)."""
    model = new_model(sizes, statistics_, images.device)
    optimizer = model.optimizer(model.parameters())  # the model's own: Adam, lr 0.01, fused
    total = args.warmup + args.steps
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.01, total_steps=total)
    batches = epoch_batches(images, targets, args.batch_size)
    for step in range(total):
        if step == args.warmup:
            sync(images.device)
            start = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            batches = epoch_batches(images, targets, args.batch_size)
            batch = next(batches)
        loss = F.cross_entropy(model(batch[0]), batch[1])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    sync(images.device)
    return 1000 * (time.perf_counter() - start) / args.steps


def epoch_batches(images, targets, batch_size: int):
    """One epoch's batches: the split gathered in a fresh order once, on its device, then sliced (no copy)."""
    order = torch.randperm(len(images), device=images.device)
    images, targets = images[order], targets[order]
    return ((images[i : i + batch_size], targets[i : i + batch_size]) for i in range(0, len(images), batch_size))


def graphed_loop(args, sizes, statistics_, images, targets) -> float:
    """ms per step of the plain step captured in one CUDA graph (module docstring)."""
    model = new_model(sizes, statistics_, images.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, capturable=True)
    static_images, static_targets = images[: args.batch_size].clone(), targets[: args.batch_size].clone()
    side = torch.cuda.Stream()  # warm-up on a side stream before capturing, as torch's docs do
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(static_images), static_targets).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)  # backward then makes the gradients in the graph's own memory
    with torch.cuda.graph(graph):
        F.cross_entropy(model(static_images), static_targets).backward()
        optimizer.step()
    batches = epoch_batches(images, targets, args.batch_size)
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            sync(images.device)
            start = time.perf_counter()
        batch = next(batches, None)
        if batch is None or len(batch[0]) < args.batch_size:  # the graph's input has one size
            batches = epoch_batches(images, targets, args.batch_size)
            batch = next(batches)
        static_images.copy_(batch[0])
        static_targets.copy_(batch[1])
        graph.replay()
    sync(images.device)
    return 1000 * (time.perf_counter() - start) / args.steps


def bare_fit(args, sizes, strategy: str) -> float:
    """ms per step of a bare Trainer with this strategy (module docstring)."""
    from benchmarks.bare_trainer import bare_trainer
    from datamodules import MNISTDataModule
    from models import ConvNet

    clock = TrainingClock(skip_steps=args.warmup)
    trainer = bare_trainer(
        strategy=strategy,
        stop_every_n_steps=None,  # Lightning's loop alone
        devices=1,
        max_steps=args.warmup + args.steps,
        num_sanity_val_steps=0,
        callbacks=[clock],
    )
    datamodule = MNISTDataModule(
        dataset="mnist", data_dir=args.data_dir, batch_size=args.batch_size, on_device=torch.cuda.is_available()
    )
    trainer.fit(ConvNet(**sizes), datamodule=datamodule)  # its `setup` takes the statistics of the datamodule
    return clock.ms_per_step()


def train_py_fit(args, sizes, root: Path, strategy: str, *extra: str) -> float:
    """train.py's `fit`, as its command line builds it, plus the clock; the net's sizes, the strategy and `extra`
    given as its options."""
    from train import TrainCLI

    options = ["--model", "ConvNet", "--data.dataset", "mnist", "--data.batch_size", str(args.batch_size)]
    options += [f"--model.{key}={json.dumps(value)}" for key, value in sizes.items()]
    options += ["--data.on_device", str(torch.cuda.is_available()).lower(), "--data.data_dir", args.data_dir]
    options += ["--trainer.default_root_dir", str(root), "--trainer.max_steps", str(args.warmup + args.steps)]
    options += ["--trainer.num_sanity_val_steps", "0", "--trainer.limit_val_batches", "0"]
    options += ["--trainer.strategy", strategy, "--trainer.devices", "1"]
    clock = "--trainer.callbacks+=benchmarks.warm_clock.TrainingClock"
    options += [clock, f"--trainer.callbacks.skip_steps={args.warmup}", *extra]
    trainer = TrainCLI(["fit", *options]).trainer
    return next(callback for callback in trainer.callbacks if type(callback).__name__ == "TrainingClock").ms_per_step()


if __name__ == "__main__":
    main()
