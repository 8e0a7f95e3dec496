"""What a user waits for: whole commands, from Enter to the prompt, train.py against the tutorial program.

Each row runs the tutorial program (`tutorial_ddp.py`) and train.py on the same task, with 1 and 2 processes,
interleaved A B A B round by round so that the machine's slow moments hit both; medians over rounds. Every
train.py run also reports where its time went (`phases.py`: start-up to the first training step, training,
validation, the dashboard, checkpoints, test, and the time from the summary line to the exit). The `images` row
times train.py with and without the dashboard's images.

    python benchmarks/end_to_end.py --data-dir ../shared/datasets
    python benchmarks/end_to_end.py --data-dir ../shared/datasets --rows defaults images --processes 1

With `--accelerator gpu` the tutorial program is its GPU version, started by torchrun (`tutorial_ddp.py`).
"""

import argparse
import datetime
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.startup_stamps import read_stamps  # noqa: E402

PHASES = ("start-up", "training", "validation", "dashboard", "checkpoints", "test")


@dataclass
class Row:
    title: str
    train: list[str]  # train.py's arguments, besides data folder, processes and accelerator
    tutorial: list[str] | None  # tutorial_ddp.py's; None: the row compares two train.py commands
    target: float | None = None  # the speed-up over the tutorial that the row should reach


ROWS = {
    "recipe": Row(
        "the tutorial's recipe: SeqNet, Adam lr 0.01 constant, batch 100, 10 epochs",
        ["--config", "configs/seqnet_fashion_mnist.yaml", "--data.dataset", "mnist"],
        ["--model", "seqnet", "--batch-size", "100", "--epochs", "10"],
        target=1.4,
    ),
    "defaults": Row(
        "SeqNet, class defaults, batch 100, 3 epochs",
        ["--model", "SeqNet", "--data.dataset", "mnist", "--data.batch_size", "100", "--trainer.max_epochs", "3"],
        ["--model", "seqnet", "--batch-size", "100", "--epochs", "3"],
        target=1.1,
    ),
    "convnet": Row(
        "ConvNet, class defaults (batch 64), 1 epoch",
        ["--model", "ConvNet", "--data.dataset", "mnist", "--trainer.max_epochs", "1"],
        ["--model", "convnet", "--batch-size", "64", "--epochs", "1"],
    ),
    "images": Row(
        "SeqNet, class defaults, 3 epochs: dashboard images on (default) and off",
        ["--model", "SeqNet", "--data.dataset", "mnist", "--trainer.max_epochs", "3"],
        None,
    ),
}
IMAGES_OFF = ["--dashboard.images_every_n_epochs", "0"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/datasets", help="folder holding MNIST/raw/")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--accelerator", default="cpu", help="train.py's --trainer.accelerator")
    args = parser.parse_args()
    args.data_dir = str(Path(args.data_dir).resolve())

    print_machine()
    results: dict[tuple[str, int, str], list[dict]] = {}
    for round_index in range(args.rounds):
        for name in args.rows:
            for processes in args.processes:
                for program, command in commands(args, ROWS[name], processes).items():
                    run = time_command(command, processes, program != "tutorial")
                    results.setdefault((name, processes, program), []).append(run)
                    progress = f"round {round_index + 1}: {name} x{processes} {program}: {run['wall']:.1f} s"
                    print(progress, file=sys.stderr)
    for name in args.rows:
        print_row(args, name, results)
    print_phases(args, results)


def commands(args: argparse.Namespace, row: Row, processes: int) -> dict[str, list[str]]:
    """The commands of one row, by program, in the order they run."""
    train = [
        *(sys.executable, str(REPO / "train.py"), *map(in_repo, row.train), "--data.data_dir", args.data_dir),
        *("--devices", str(processes), "--trainer.accelerator", args.accelerator),
    ]
    if row.tutorial is None:
        return {"images on": train, "images off": [*train, *IMAGES_OFF]}
    tutorial = [str(REPO / "benchmarks" / "tutorial_ddp.py"), *row.tutorial, "--data-dir", args.data_dir]
    if args.accelerator == "gpu":  # the tutorial series' GPU program: torchrun, nccl, a GPU per process
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
        tutorial = [*torchrun, *tutorial, "--dataset", "mnist"]
    else:
        tutorial = [sys.executable, *tutorial, "--dataset", "mnist", "--processes", str(processes)]
        tutorial += ["--port", str(free_port())]
    return {"tutorial": tutorial, "train.py": train}


def in_repo(argument: str) -> str:
    """A file of the repository (configs/...) by its absolute path: the commands run in a folder of their own."""
    return str(REPO / argument) if (REPO / argument).is_file() else argument


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def time_command(command: list[str], processes: int, train_py: bool) -> dict:
    """Run a command in a fresh folder (train.py writes runs/ there) and time it from start to exit.

    train.py runs get `phases.py`'s profiler; its figures come back with the wall time and the time from the
    summary line ("Finished: ...") to the exit. The tutorial's processes get cores / processes threads each, as
    Lightning gives train.py's: the tutorial's own default, all cores in every process, made it 2x slower here.
    """
    with tempfile.TemporaryDirectory() as folder:
        phases_file = Path(folder, "phases.json")
        if train_py:
            command = [*command, "--trainer.profiler", "benchmarks.phases.PhaseProfiler"]
        start = time.time()
        python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1"}
        if not train_py:
            env["OMP_NUM_THREADS"] = str(max(1, os.cpu_count() // processes))
        env |= {"E2E_T0": repr(start), "E2E_PHASES": str(phases_file), "STARTUP_STAMPS": folder}
        process = subprocess.Popen(
            command, cwd=folder, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        summary_at, output = None, []
        metrics = {}
        for line in process.stdout:
            output.append(line)
            if line.startswith("Finished:") and summary_at is None:
                summary_at = time.time()
                words = line.split()[1:]  # Finished: test/acc 0.9912  test/loss 0.0301 ...
                metrics |= {name: float(value) for name, value in zip(words[::2], words[1::2], strict=True)}
            if warm := re.search(r"warm training s: ([\d.]+)", line):  # benchmarks/warm_clock.py, where added
                metrics["warm training s"] = float(warm[1])  # (after a progress bar's carriage return, maybe)
        code = process.wait(timeout=1800)
        end = time.time()
        if code != 0:
            sys.exit(f"failed ({code}): {' '.join(command)}\n{''.join(output[-20:])}")
        run = {"wall": end - start}
        if not train_py:  # rank 0's first step, from the moments the tutorial stamps
            run["first step"] = read_stamps(Path(folder))[0]["first step"] - start
        else:
            profile = json.loads(phases_file.read_text())
            run |= {phase: profile["seconds"].get(phase, 0.0) for phase in PHASES}
            run["first step"] = profile["first_step"] - start
            run["step_ms"] = profile["step_ms"]
            run["metrics"] = metrics
            run["exit"] = end - summary_at
            run["other"] = run["wall"] - run["exit"] - sum(run[phase] for phase in PHASES)
    return run


def print_machine() -> None:
    import lightning
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(
        f"{datetime.date.today()}, {platform.node()}: {os.cpu_count()} CPU cores, {device}; Python"
        f" {platform.python_version()}, torch {torch.__version__}, Lightning {lightning.__version__}"
    )


def median(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def print_row(args: argparse.Namespace, name: str, results: dict) -> None:
    row = ROWS[name]
    first, second = ("images on", "images off") if row.tutorial is None else ("tutorial", "train.py")
    train = f"python train.py {' '.join(row.train)} --data.data_dir DATA --devices N"
    print(f"\n{row.title}, whole command, median of {args.rounds}")
    if row.tutorial:
        print(f"- tutorial: python benchmarks/tutorial_ddp.py {' '.join(row.tutorial)} --data-dir DATA --processes N")
        print(f"- train.py: {train}")
    else:
        print(f"- images on: {train}\n- images off: {train} {' '.join(IMAGES_OFF)}")
    target = f" (target {row.target}x)" if row.target else ""
    print(f"| processes | {first} s | {second} s | {first} / {second}{target} | first step: {first} s | {second} s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for processes in args.processes:
        runs = [results[(name, processes, program)] for program in (first, second)]
        a, b = (median(program_runs, "wall") for program_runs in runs)
        step_a, step_b = (median(program_runs, "first step") for program_runs in runs)
        print(f"| {processes} | {a:.1f} | {b:.1f} | {a / b:.2f} | {step_a:.1f} | {step_b:.1f} |")


def print_phases(args: argparse.Namespace, results: dict) -> None:
    columns = ("wall", "first step", *PHASES, "exit", "other")
    print(f"\nWhere each train.py run spent its time, seconds, medians of {args.rounds}")
    print("first step: from Enter to the first training step (start-up plus the sanity check's validation);")
    print("exit: from the summary line to the prompt; other: the rest (between fit and test, say)")
    print(f"| row | processes | program | {' | '.join(columns)} |")
    print(f"| --- | --- | --- | {' | '.join('---' for _ in columns)} |")
    for (name, processes, program), runs in results.items():
        if program != "tutorial":
            figures = " | ".join(f"{median(runs, column):.2f}" for column in columns)
            print(f"| {name} | {processes} | {program} | {figures} |")


if __name__ == "__main__":
    main()
