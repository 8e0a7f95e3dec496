"""train.py with time stamps (`startup_stamps.py`), for `startup.py`: run in train.py's place, with its arguments.

It imports `train` and the program it runs (`app.main`: torch, Lightning, the app; with the garbage collector off, as
train.py's `main()` does), stamps the end of the imports, wraps the moments that follow, then runs train.py's `main()`.
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
import os

from startup_stamps import set_rank, stamp

gc.disable()  # as train.py's main() does while it imports
import train  # noqa: E402 (train.py's own start-up: what this file measures; before this change, it imported all)

importlib.import_module("app.main")  # what train.py's main() imports now

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
    train.main()
