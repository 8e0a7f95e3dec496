"""Start-up with 1, 2, 4 (and 8, on 8 cores or more) processes: from Enter to the first training step, by phase.

Three ways to start the same training, interleaved round by round (the machine's slow moments hit all of them), each
command in a fresh folder, medians over rounds:

- train.py: `python train.py fit ... --devices N`, as a user types it (the processes are started by train.py);
- torchrun: `torchrun --standalone --nproc_per_node N train.py fit ... --devices N`;
- tutorial: the tutorial program (`tutorial_ddp.py`, `torch.multiprocessing.spawn`), stopped after its first step.

Every process writes the moments it reaches (`startup_stamps.py`; train.py runs through `startup_probe.py`), and the
time from Enter to rank 0's first training step is cut at them:

- imports: until rank 0 has imported torch, Lightning and the app (for torchrun and the tutorial this includes
  the launching process, which imports torch before it starts the workers);
- parse & build: until rank 0 has parsed the command line and built model, data and Trainer;
- launching: until the last process of the job has reached `init_process_group` (rank 0's checks before the
  launch, starting the other processes, and what they still have to import and build);
- process group: until rank 0's `init_process_group` returns;
- first step: until rank 0's first training step is done (Lightning's setup, data loaders, the sanity check's
  validation, the step).

The train.py rows run `fit` for one step (`--trainer.max_steps 1`), and their whole command, Enter to exit, is timed
too. `--before PATH` adds the train.py rows of another checkout (say, a `git worktree` of an earlier commit), run in
the same rounds.

    python benchmarks/startup.py --data-dir ../shared/datasets
    python benchmarks/startup.py --data-dir ../shared/datasets --before /tmp/before --launchers train.py
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from end_to_end import free_port, print_machine
from startup_stamps import read_stamps

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
PHASES = ("imports", "parse & build", "launching", "process group", "first step")
LAUNCHERS = ("train.py", "torchrun", "tutorial")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/datasets", help="folder holding MNIST/raw/")
    eight = [8] if (os.cpu_count() or 1) >= 8 else []  # 8 processes where the machine has a core for each
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, *eight])
    parser.add_argument("--launchers", nargs="+", default=list(LAUNCHERS), choices=LAUNCHERS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another checkout, whose train.py rows run in the same rounds")
    args = parser.parse_args()
    args.data_dir = str(Path(args.data_dir).resolve())
    checkouts = {"": REPO} | ({" (before)": args.before.resolve()} if args.before else {})

    print_machine()
    results: dict[tuple[str, int], list[dict]] = {}
    for round_index in range(args.rounds):
        for processes in args.processes:
            for launcher in args.launchers:
                for label, checkout in checkouts.items() if launcher != "tutorial" else [("", REPO)]:
                    run = time_start_up(args, launcher, processes, checkout)
                    results.setdefault((launcher + label, processes), []).append(run)
                    print(
                        f"round {round_index + 1}: {launcher + label} x{processes}: first step after"
                        f" {run['to first step']:.2f} s",
                        file=sys.stderr,
                    )
    print_table(args, results)


def command(args: argparse.Namespace, launcher: str, processes: int) -> list[str]:
    if launcher == "tutorial":
        return [
            *(sys.executable, str(BENCHMARKS / "tutorial_ddp.py"), "--model", "seqnet", "--epochs", "1"),
            *("--data-dir", args.data_dir, "--dataset", "mnist", "--processes", str(processes)),
            *("--port", str(free_port())),
        ]
    train = [
        *(str(BENCHMARKS / "startup_probe.py"), "fit", "--data.dataset", "mnist", "--data.data_dir", args.data_dir),
        *("--devices", str(processes), "--trainer.accelerator", "cpu", "--trainer.max_steps", "1"),
        *("--trainer.limit_val_batches", "2"),
    ]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *train]
    return [sys.executable, *train]


def time_start_up(args: argparse.Namespace, launcher: str, processes: int, checkout: Path) -> dict:
    """Run one command in a fresh folder; the phases of its start-up and, for train.py, its whole time."""
    with tempfile.TemporaryDirectory() as folder:
        stamps = Path(folder, "stamps")
        stamps.mkdir()
        python_path = os.pathsep.join(filter(None, [str(checkout), str(BENCHMARKS), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": python_path, "STARTUP_STAMPS": str(stamps)}
        if launcher == "tutorial":  # as Lightning gives train.py's processes (end_to_end.py says why)
            env["OMP_NUM_THREADS"] = str(max(1, os.cpu_count() // processes))
        run_command = command(args, launcher, processes)
        start = time.time()
        process = subprocess.Popen(
            run_command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        if launcher == "tutorial":  # it trains a whole epoch: stop it once rank 0 has taken its first step
            while process.poll() is None and "first step" not in read_stamps(stamps).get(0, {}):
                time.sleep(0.05)
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate(timeout=600)
        end = time.time()
        ranks = read_stamps(stamps)
        if (launcher != "tutorial" and process.returncode != 0) or "first step" not in ranks.get(0, {}):
            sys.exit(f"failed ({process.returncode}): {' '.join(run_command)}\n{output.decode()[-3000:]}")
    return phases(start, ranks) | ({"whole command": end - start} if launcher != "tutorial" else {})


def phases(start: float, ranks: dict[int, dict]) -> dict[str, float]:
    rank0 = ranks[0]
    all_met = max(moments["meeting"] for moments in ranks.values())
    bounds = [start, rank0["imported"], rank0["built"], all_met, rank0["met"], rank0["first step"]]
    return {phase: bounds[i + 1] - bounds[i] for i, phase in enumerate(PHASES)} | {"to first step": bounds[-1] - start}


def print_table(args: argparse.Namespace, results: dict) -> None:
    columns = (*PHASES, "to first step", "whole command")
    print(f"\nSeconds from Enter, medians of {args.rounds} interleaved rounds; x1: to first step against 1 process")
    print(f"| launcher | processes | {' | '.join(columns)} | x1 |")
    print(f"| --- | --- | {' | '.join('---' for _ in columns)} | --- |")
    for (launcher, processes), runs in sorted(results.items(), key=lambda item: (item[0][0], item[0][1])):
        figures = [statistics.median(run[c] for run in runs) if c in runs[0] else None for c in columns]
        one = results.get((launcher, 1))
        ratio = figures[-2] / statistics.median(run["to first step"] for run in one) if one else None
        cells = ["-" if figure is None else f"{figure:.2f}" for figure in figures]
        print(f"| {launcher} | {processes} | {' | '.join(cells)} | {'-' if ratio is None else f'{ratio:.2f}'} |")


if __name__ == "__main__":
    main()
