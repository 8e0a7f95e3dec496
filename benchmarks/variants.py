"""train.py commands side by side: one command with variants of its options, interleaved round by round.

Each variant adds its options to the common ones; every round runs each variant once, in a fresh folder, so that the
machine's slow moments hit all of them. For each: the whole command (Enter to prompt), the time to the first training
step, the training time (`phases.py`), the steady step and the samples per second it gives, and the test accuracy.
Where a command adds `benchmarks.warm_clock.WarmClock`, its training time as a speed record measures it too (warm
training s: each run's). Used for what a setting changes in a whole run (`--model.compile reduce-overhead` on a GPU,
say), for time to accuracy over seeds (a variant per seed), and for start-up on one launcher against another.

    python benchmarks/variants.py --data-dir ../shared/datasets --rounds 2 \\
        --common "--model ConvNet --data.dataset mnist --trainer.max_epochs 2" \\
        --variant "defaults=" --variant "compiled=--model.compile true"
"""

import argparse
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.end_to_end import REPO, print_machine, time_command  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/datasets", help="folder holding MNIST/raw/")
    parser.add_argument("--common", default="", help="train.py options of every variant")
    parser.add_argument("--variant", action="append", required=True, help="NAME=OPTIONS, added to the common ones")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    variants = dict(variant.split("=", 1) for variant in args.variant)
    if len(variants) < len(args.variant):
        parser.error("two variants have the same name")
    common = [*shlex.split(args.common), "--data.data_dir", str(Path(args.data_dir).resolve())]

    print_machine()
    results: dict[str, list[dict]] = {name: [] for name in variants}
    for round_index in range(args.rounds):
        for name, options in variants.items():
            command = [sys.executable, str(REPO / "train.py"), *common, *shlex.split(options)]
            run = time_command(command, processes=1, train_py=True)
            results[name].append(run)
            print(f"round {round_index + 1}: {name}: {summary(run)}", file=sys.stderr, flush=True)

    print(f"\npython train.py {args.common} --data.data_dir DATA, and each variant's options; medians of {args.rounds}")
    print(
        "| variant | options | whole command s | first step s | training s | step ms | samples/s/rank | test/acc"
        " | warm training s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, runs in results.items():
        figures = [statistics.median(run[key] for run in runs) for key in ("wall", "first step", "training")]
        steps = [run["step_ms"] for run in runs if run["step_ms"] is not None]  # none in a run of 21 steps or fewer
        step_ms = statistics.median(steps) if steps else float("nan")
        accuracy = ", ".join(f"{run['metrics'].get('test/acc', float('nan')):.4f}" for run in runs)
        warm = ", ".join(
            f"{run['metrics']['warm training s']:.3f}" for run in runs if "warm training s" in run["metrics"]
        )
        samples = batch_of(common + shlex.split(variants[name])) / step_ms * 1000
        print(
            f"| {name} | `{variants[name]}` | {' | '.join(f'{x:.2f}' for x in figures)} | {step_ms:.2f} | "
            f"{samples:,.0f} | {accuracy} | {warm} |"
        )


def batch_of(options: list[str]) -> int:
    """The batch per process that the options give on the command line (the last --data.batch_size, or the
    datamodule's default: a config file's is not read)."""
    sizes = [options[i + 1] for i, option in enumerate(options[:-1]) if option == "--data.batch_size"]
    return int(sizes[-1]) if sizes else 64


def summary(run: dict) -> str:
    return (
        f"{run['wall']:.1f} s, first step {run['first step']:.1f} s, training {run['training']:.2f} s, "
        f"step {run['step_ms'] or float('nan'):.2f} ms, {run['metrics']}"
    )


if __name__ == "__main__":
    main()
