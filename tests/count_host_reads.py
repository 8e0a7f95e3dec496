"""`python tests/count_host_reads.py OUT_DIR TRAIN_ARGS...`: run `train.py TRAIN_ARGS` and record, in every process,
where a tensor value was read back to the host, which of the project's own functions (in app/) the main thread
called once training had started (up to the COUNT_CALLS_UNTIL_STEP-th optimizer step, where that variable is set:
tracing slows every call), and after each optimizer step the line STEP; each rank writes its list to
OUT_DIR/rank<N>.json.

Lightning's launcher starts the other ranks with this same command line, so they count too.
"""

import json
import os
import sys
import traceback
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from train import main  # noqa: E402

HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__")
STEP = "optimizer step"
CALL = "call "  # the prefix of a call of the project's own code: "call graceful_stop.py:on_train_batch_end"
APP = str(Path(__file__).resolve().parents[1] / "app") + os.sep


def count_reads(reads: list[str]) -> None:
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counting(tensor, *args, _original=original, _name=name, **kwargs):
            caller = traceback.extract_stack(limit=3)[0]
            # torch's optimizers keep their step counts on the CPU even when training on a GPU (unless
            # `capturable`), precisely so that reading them costs no synchronisation.
            if "/torch/optim/" not in caller.filename:
                reads.append(f"{_name} in {caller.filename}:{caller.lineno}")
            return _original(tensor, *args, **kwargs)

        setattr(torch.Tensor, name, counting)


def call_recorder(events: list[str]):
    """A trace function (`sys.settrace`: called at Python calls only, not C ones, as a profile function is) that
    records every call of a function of app/ in its thread, and traces nothing inside it."""

    def trace(frame, event: str, arg) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(APP):
            events.append(f"{CALL}{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}")

    return trace


if __name__ == "__main__":
    out_dir, argv = Path(sys.argv[1]), sys.argv[2:]
    reads: list[str] = []
    count_reads(reads)
    record_calls = call_recorder(reads)

    last_step = int(os.environ.get("COUNT_CALLS_UNTIL_STEP", "0"))  # 0: to the end (tracing slows every call)
    steps = [0]

    def after_each_step(*_) -> None:
        reads.append(STEP)
        steps[0] += 1
        done = last_step and steps[0] >= last_step
        sys.settrace(None if done else record_calls)  # the main thread's calls, from the first step on

    register_optimizer_step_post_hook(after_each_step)
    try:
        main(argv)
    finally:
        rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
        (out_dir / f"rank{rank}.json").write_text(json.dumps(reads))
