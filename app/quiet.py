"""Silence messages that do not concern a user of this program; keep every other warning."""

import atexit
import logging
import os
import sys
import warnings


class _DropAdvertisement(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


def silence_noise(subcommand: str | None) -> None:
    # train.py hands LightningCLI a rewritten command line on purpose.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    # Lightning 2.6 calls a torch.utils._pytree API that newer torch deprecates; nothing a user can change.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # torchdata's StatefulDataLoader calls a torch function that torch deprecated; nothing a user can change.
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    # `test`, `validate` and `predict` save no checkpoint, so that this run's checkpoint folder differs from the
    # one the checkpoint was saved in does not matter (Lightning warns once per process).
    if subcommand in ("validate", "test", "predict"):
        warnings.filterwarnings("ignore", message="The dirpath has changed from")
    # An advertisement for a hosted logging service, printed by every Trainer.
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_DropAdvertisement())


def silence_the_shutdown() -> None:
    """Once the program has said everything, send what Python's shutdown prints after it to /dev/null.

    train.py freezes the objects its imports create (`gc.freeze`), so they are never freed, and libraries bound with
    nanobind (triton's, which torch imports) report theirs as leaks after the interpreter has shut down: a wall of
    "nanobind: leaked ..." lines under the program's last line, at every exit. Called before anything else registers
    an exit handler, the silencing runs after every other one; the exit status stays as it is.
    """

    def silence() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # where C code writes too

    atexit.register(silence)
