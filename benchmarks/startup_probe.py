"""train.py with time stamps (`startup_stamps.py`), for `startup.py`: run in train.py's place, with its arguments.

It imports train.py's program, stamps the end of the imports, wraps the moments that follow, then runs train.py's
`main()`. Which program that is depends on the checkout it runs in (the first `train` on the path: `startup.py` puts
the checkout in PYTHONPATH; without one, this file's own):

- this layout: `train.py` is the program (`TrainCLI`, `main`): `import train` imports torch, Lightning and `app/`;
- the layout before 2026-11-28 (an `app/main.py`, as a `--before` checkout may have): `train.py` only starts
  `app.main`, with the garbage collector off while importing; the probe imports both the same way.

Processes that Lightning's launcher starts run this file again, since they re-run the command line; under torchrun
every worker runs it.

- imported: torch, Lightning and the app imported;
- built: the command line parsed and model, data and Trainer built (`Trainer.fit` or another stage called);
- meeting / met: `torch.distributed.init_process_group` called / returned;
- first step: the first training step done (optimizer step included).
"""

import functools
import gc
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from startup_stamps import set_rank, stamp

sys.path.append(str(Path(__file__).resolve().parents[1]))  # this checkout, after PYTHONPATH's (startup.py's choice)
# The old layout's train.py imports `app.main` in its main(), with the collector off (and frozen after): the same here.
OLD_LAYOUT = Path(importlib.util.find_spec("train").origin).parent.joinpath("app", "main.py").is_file()
if OLD_LAYOUT:
    gc.disable()
import train  # noqa: E402 (train.py's own start-up: what this file measures)

if OLD_LAYOUT:
    importlib.import_module("app.main")  # what the old train.py's main() imports

stamp("imported")

import lightning.pytorch as pl  # noqa: E402 (imported already by train)
import torch.distributed  # noqa: E402
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop  # noqa: E402


def wrap(owner: object, name: str, before: str | None = None, after: str | None = None) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)  # LightningCLI reads the options of `fit` and the others from their signatures
    def wrapped(*args, **kwargs):
        if before:
            stamp(before)
        result = original(*args, **kwargs)
        if after:
            stamp(after)
        return result

    setattr(owner, name, wrapped)


for stage in ("fit", "validate", "test", "predict"):
    wrap(pl.Trainer, stage, before="built")
wrap(torch.distributed, "init_process_group", before="meeting", after="met")
wrap(_TrainingEpochLoop, "advance", after="first step")
set_rank(int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))))  # one node: the local rank

if __name__ == "__main__":
    train.main()  # ends the process (sys.exit, or the signal that stopped it)
