"""What the fault handling costs a run: the same train.py command from this tree with and without the stall watchdog
(`StallWatchdog`, `--watchdog.timeout 0`: no thread, no socket), and from another revision where one is given, in
interleaved rounds (A B C A B C ...), so that a slow moment of the machine slows all. The stop check (`GracefulStop`,
every `--stop.every_n_steps`) has no switch: `overhead.py` and `levers.py` price it every step against every 50.

For each variant: the whole command (Enter to prompt) and the steady-state training step (the median of the
dashboard's `workload/step_ms`, logged every `--trainer.log_every_n_steps` steps). The other revision (`--before`,
say c8b1403, from before the fault handling) is checked out into a temporary git worktree and run with this tree's
interpreter, with the same command and no more options.

    python benchmarks/fault_handling_cost.py --data-dir ../shared/datasets --rounds 3
    python benchmarks/fault_handling_cost.py --before c8b1403 --data-dir ../shared/datasets --rounds 3
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a git revision to compare with (none: this tree alone)")
    parser.add_argument("--data-dir", default="../shared/datasets", help="folder holding MNIST/raw/")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    data_dir = str(Path(args.data_dir).resolve())
    command = [
        "fit",
        *("--model", "SeqNet", "--data.dataset", "mnist", "--data.data_dir", data_dir, "--devices", str(args.devices)),
        *("--trainer.max_epochs", str(args.epochs), "--trainer.accelerator", "cpu"),
        *("--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "20"),
    ]
    variants = {
        "this tree": (REPO, []),
        "this tree, --watchdog.timeout 0": (REPO, ["--watchdog.timeout", "0"]),
    }
    with tempfile.TemporaryDirectory() as scratch:
        if args.before is None:
            print_table(args, interleaved_rounds(variants, command, args.rounds, Path(scratch)), "vs this tree")
            return
        before = Path(scratch) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before], cwd=REPO, check=True)
        try:
            variants = {f"{args.before} (before)": (before, []), **variants}
            results = interleaved_rounds(variants, command, args.rounds, Path(scratch))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=REPO)
    print_table(args, results, "vs before")


def interleaved_rounds(
    variants: dict[str, tuple[Path, list[str]]], command: list[str], rounds: int, scratch: Path
) -> dict[str, list[tuple[float, float]]]:
    """Each variant (a checkout, more options) of `command`, once per round, in turn: A B C A B C ..., so that a slow
    moment of the machine slows all; for each, the wall time and the median step of each of its runs."""
    results = {name: [] for name in variants}
    for round_ in range(rounds):
        for index, (name, (checkout, extra)) in enumerate(variants.items()):
            root = scratch / f"runs-{round_}-{index}"
            results[name].append(run(checkout, [*command, *extra, "--trainer.default_root_dir", str(root)]))
            print(f"round {round_ + 1}: {name}: {results[name][-1][0]:.1f} s", file=sys.stderr)
    return results


def print_table(args: argparse.Namespace, results: dict[str, list[tuple[float, float]]], ratio: str) -> None:
    """The medians of each variant, its whole command against the first variant's under `ratio`."""
    reference = statistics.median(wall for wall, _ in results[next(iter(results))])
    print(f"\n{args.devices} processes, SeqNet, {args.epochs} epochs, real MNIST, medians of {args.rounds} rounds\n")
    print(f"| variant | whole command | {ratio} | training step (median workload/step_ms) |")
    print("| --- | --- | --- | --- |")
    for name, runs in results.items():
        wall = statistics.median(wall for wall, _ in runs)
        step = statistics.median(step for _, step in runs)
        print(f"| {name} | {wall:.2f} s | {wall / reference:.3f} | {step:.2f} ms |")


def run(checkout: Path, command: list[str]) -> tuple[float, float]:
    """Run train.py in `checkout`; the wall time and the median training step of the run."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "train.py", *command], cwd=checkout, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"train.py failed in {checkout}:\n{done.stderr[-3000:]}")
    root = Path(command[command.index("--trainer.default_root_dir") + 1])
    (run_dir,) = root.glob("SeqNet-mnist/version_*")
    events = EventAccumulator(str(run_dir))
    events.Reload()
    # The revision compared may be older than the dashboard's `workload/` group.
    tag = "workload/step_ms" if "workload/step_ms" in events.Tags()["scalars"] else "perf/step_ms"
    return wall, statistics.median(event.value for event in events.Scalars(tag))


if __name__ == "__main__":
    main()
