"""Each speed lever against the project's default Lightning path, side by side, one setting changed at a time.

Every lever is a setting of train.py (the second column of the table says which); here it runs in the Lightning
path of `ddp_paths.py` (the bare training loop, steady state only), interleaved with the defaults round by round,
median over rounds. The ratio is the lever's samples/s over the defaults' in the same round set.

    python benchmarks/levers.py --data-dir ../shared/datasets --model SeqNet --devices 2 --batch-size 512
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ddp_paths import add_data_arguments, medians, run_job  # noqa: E402

STRATEGY = "--trainer.strategy DDPStrategy --trainer.strategy."
# name: (the train.py setting, the options of ddp_paths.lightning_loop that apply it)
LEVERS = {
    "defaults": ("", {}),
    "Adam not fused": ("--model.optimizer.fused false", {"adam": {"fused": False}}),
    "stop check every step": ("--stop.every_n_steps 1", {"stop_every_n_steps": 1}),
    "no stall watchdog": ("--watchdog.timeout 0", {"watchdog_timeout": 0}),
    "bucket view": (f"{STRATEGY}gradient_as_bucket_view true", {"strategy": {"gradient_as_bucket_view": True}}),
    "static_graph": (f"{STRATEGY}static_graph true", {"strategy": {"static_graph": True}}),
    "no broadcast_buffers": (f"{STRATEGY}broadcast_buffers false", {"strategy": {"broadcast_buffers": False}}),
    "bf16-mixed": ("--trainer.precision bf16-mixed", {"trainer": {"precision": "bf16-mixed"}}),
    "torch.compile": ("--model.compile true", {"model": {"compile": True}}),
    "channels_last": ("--model.channels_last true", {"model": {"channels_last": True}}),
    "data on device": ("--data.on_device true", {"data": {"on_device": True}}),
    "pinned memory": ("--data.pin_memory true", {"data": {"pin_memory": True}}),
    "all cores per rank": (f"OMP_NUM_THREADS={os.cpu_count()}", {"env": {"OMP_NUM_THREADS": str(os.cpu_count())}}),
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(parser)
    parser.add_argument("--devices", type=int, default=2, help="processes")
    parser.add_argument("--steps", type=int, default=200, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first (compilation happens there)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--levers", nargs="+", default=list(LEVERS), choices=list(LEVERS))
    args = parser.parse_args()
    levers = ["defaults", *(name for name in args.levers if name != "defaults")]

    results: dict[str, list[dict]] = {name: [] for name in levers}
    for round_index in range(args.rounds):
        for name in levers:
            results[name].append(run_job(args, "lightning", args.devices, LEVERS[name][1]))
            print(f"round {round_index + 1}: {name} done", file=sys.stderr)

    print(
        f"\n{args.model}, batch {args.batch_size} per process, {args.devices} processes, {args.steps} timed steps "
        f"after {args.warmup}, median of {args.rounds} rounds, device: {results['defaults'][0]['device']}"
    )
    print("| lever | train.py setting | samples/s (total) | ms/step | peak MiB/rank | vs defaults |")
    print("| --- | --- | --- | --- | --- | --- |")
    median = {name: medians(runs) for name, runs in results.items()}
    for name in levers:
        m = median[name]
        ratio = m["samples_per_s"] / median["defaults"]["samples_per_s"]
        setting = f"`{LEVERS[name][0]}`" if LEVERS[name][0] else "(defaults)"
        print(
            f"| {name} | {setting} | {m['samples_per_s']:,.0f} | {m['ms_per_step']:.2f} | "
            f"{m['peak_mib_per_rank']:.0f} | {ratio:.2f} |"
        )


if __name__ == "__main__":
    main()
