"""What an elastic job costs and what a lost node costs (docs/multinode.md, "Elastic").

1. The price of last.ckpt every minute, the default of a job torchrun restarts: the same train.py command without,
   with `--stop.save_every_s 60` (the default there: decided in the stop check's all-reduce every 50 steps,
   `GracefulStop`) and with one more Lightning `ModelCheckpoint(train_time_interval=0:01:00)` (a broadcast before
   every step), in interleaved rounds (A B C A B C ...), so that a slow moment of the machine slows all: the whole
   command, and the median training step (`workload/step_ms`).
2. From the loss to training again: an elastic torchrun job of two nodes on this machine
   (`LAUNCHER=torchrun NNODES=1:2 scripts/local_cluster.sh 2 1`) whose node 1 is killed (SIGKILL, its torchrun
   agent and its process, `tests.instruments.KillNodeOnce`) at a step of epoch 1; the job goes on on node 0.
   Reported: the time from the kill to the end of the first training step after it (the TensorBoard event of that
   step's loss), and the steps lost (the restarted job says the step it continues from).

    python benchmarks/elastic.py --data-dir ../shared/datasets --rounds 3
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.fault_handling_cost import interleaved_rounds, print_table  # noqa: E402

# Lightning's own timed last.ckpt: one more ModelCheckpoint, as train.py's command line adds a callback.
TIMED_CHECKPOINT = [
    "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
    "--trainer.callbacks.train_time_interval=0:01:00",
    "--trainer.callbacks.filename=last",
    "--trainer.callbacks.enable_version_counter=false",
]
CONTINUED = re.compile(r"--ckpt_path last: continuing .*\(step (\d+), epoch \d+\)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/datasets", help="folder holding MNIST/raw/")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kill-step", type=int, default=620, help="the step before which node 1 is killed")
    parser.add_argument("--interval", type=float, default=5, help="the elastic job's --stop.save_every_s")
    args = parser.parse_args()
    data_dir = str(Path(args.data_dir).resolve())
    data = ("--model", "SeqNet", "--data.dataset", "mnist", "--data.data_dir", data_dir, "--trainer.accelerator", "cpu")
    quiet = ("--trainer.enable_progress_bar", "false")
    with tempfile.TemporaryDirectory() as scratch:
        print_checkpoint_cost(args, [*data, *quiet, "--trainer.log_every_n_steps", "20"], Path(scratch))
        print_time_to_train_again(args, [*data, *quiet, "--trainer.log_every_n_steps", "1"], Path(scratch))


def print_checkpoint_cost(args: argparse.Namespace, common: list[str], scratch: Path) -> None:
    command = ["fit", *common, "--devices", str(args.devices), "--trainer.max_epochs", str(args.epochs)]
    variants = {
        "last.ckpt at each epoch's end (the default)": (REPO, []),
        "and every minute, at the stop check (a restartable job's default)": (REPO, ["--stop.save_every_s", "60"]),
        "and every minute, by Lightning's ModelCheckpoint": (REPO, TIMED_CHECKPOINT),
    }
    print_table(args, interleaved_rounds(variants, command, args.rounds, scratch), "ratio")


def print_time_to_train_again(args: argparse.Namespace, common: list[str], scratch: Path) -> None:
    print(f"\nNode 1 of an elastic 2 x 1 torchrun job killed before step {args.kill_step} (epoch 1 of 2), last.ckpt")
    print(f"every {args.interval:g} s of training; torchrun's --rdzv-conf as scripts/local_cluster.sh sets it\n")
    print("| round | kill to the end of the first step after it | steps lost |")
    print("| --- | --- | --- |")
    for round_ in range(args.rounds):
        root = scratch / f"elastic-{round_}"
        kill = ("--trainer.callbacks+=tests.instruments.KillNodeOnce", "--trainer.callbacks.rank", "1")
        command = [*common, "--trainer.max_epochs", "2", "--trainer.default_root_dir", str(root), "--ckpt_path", "last"]
        command += ["--stop.save_every_s", str(args.interval)]
        command += [*kill, "--trainer.callbacks.step", str(args.kill_step)]
        env = {**os.environ, "LAUNCHER": "torchrun", "NNODES": "1:2", "MAX_RESTARTS": "3", "PYTHON": sys.executable}
        done = subprocess.run(
            ["scripts/local_cluster.sh", "2", "1", "--", *command], cwd=REPO, env=env, capture_output=True, text=True
        )
        output = done.stdout + done.stderr
        printed = CONTINUED.findall(output)  # the restarted job's line (the first attempt started a new run)
        if done.returncode != 0 or not printed:
            sys.exit(f"the elastic job failed (status {done.returncode}):\n{output[-3000:]}")
        killed_at = float((root / "node-killed").read_text())
        (run_dir,) = root.glob("SeqNet-mnist/version_*")
        events = EventAccumulator(str(run_dir))
        events.Reload()
        restart_step = int(printed[-1])
        # the first step the restarted job trained (the first attempt logged it too, before the kill)
        again = [e for e in events.Scalars("train/loss") if e.step == restart_step + 1 and e.wall_time > killed_at]
        first = min(again, key=lambda event: event.wall_time)
        lost = args.kill_step - restart_step
        print(f"| {round_ + 1} | {first.wall_time - killed_at:.1f} s | {lost} |")


if __name__ == "__main__":
    main()
