"""Silence messages that do not concern a user of this program; keep every other warning."""

import atexit
import logging
import os
import subprocess
import sys
import warnings


class _DropLines(logging.Filter):
    """Drop the log records whose message holds one of `parts` (or, with `at_end`, ends with one)."""

    def __init__(self, *parts: str, at_end: bool = False) -> None:
        super().__init__()
        self.parts = parts
        self.at_end = at_end

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.at_end:
            return not message.endswith(self.parts)
        return not any(part in message for part in self.parts)


# Lightning's lines that say nothing to a user of this program, and why:
LIGHTNING_NOISE = (
    "litlogger",  # an advertisement for a hosted logging service, printed by every Trainer
    "Starting with 1 processes",  # the process group's banner, for a job of one process
    "Trainer already configured with model summary callbacks",  # this program's summary (app/run/model_summary.py)
    "Restoring states from the checkpoint path at",  # a checkpoint being read: the program says which it continues
    "Restored all states from the checkpoint at",  # (`--ckpt_path ...: continuing ...`) or the summary names it
    "Loaded model weights from the checkpoint at",
)
# One instance each, which `addFilter` adds once however many commands a process runs (a notebook's)
_NOISE = _DropLines(*LIGHTNING_NOISE)
_ONE_MEMBER = _DropLines("MEMBER: 1/1", at_end=True)  # "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/1"


def silence_noise(subcommand: str | None) -> None:
    # train.py hands LightningCLI a rewritten command line on purpose.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    # Lightning 2.6 calls a torch.utils._pytree API that newer torch deprecates; nothing a user can change.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # torchdata's StatefulDataLoader calls a torch function that torch deprecated; nothing a user can change.
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    # An evaluation saves no checkpoint: that its checkpoint folder is another than the checkpoint's does not matter.
    if subcommand in ("validate", "test", "predict"):
        warnings.filterwarnings("ignore", message="The dirpath has changed from")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_NOISE)
    # A job of one process has nothing to initialise.
    logging.getLogger("lightning.fabric.utilities.distributed").addFilter(_ONE_MEMBER)


# What nanobind prints after the interpreter has shut down about objects never freed, and nothing else.
SHUTDOWN_NOISE = (b"nanobind: ", b" - leaked ", b" - ... skipped remainder", b"See https://nanobind.readthedocs.io/")
NOISE_FILTER = f"""
import sys
for line in sys.stdin.buffer:
    if not line.startswith({SHUTDOWN_NOISE!r}):
        sys.stderr.buffer.write(line)
        sys.stderr.buffer.flush()
"""


def silence_a_continuation() -> None:
    """A continued run writes into its own checkpoint folder: Lightning's warning that it is not empty says nothing."""
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")


def silence_the_shutdown() -> None:
    """At exit, pass standard error through a filter (a second Python process) that drops nanobind's leak reports
    of the objects train.py froze (`gc.freeze`) and keeps everything else. Registered first, it starts after every
    other exit handler has run."""

    def filter_the_rest() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        command = [sys.executable, "-S", "-I", "-c", NOISE_FILTER]
        try:
            subprocess.Popen(command, stdin=read_end, stdout=subprocess.DEVNULL, close_fds=True)
        except OSError:  # no process can be started: keep the noise rather than lose a message
            return
        finally:
            os.close(read_end)
        os.dup2(write_end, 2)  # where C code writes too
        os.close(write_end)

    atexit.register(filter_the_rest)
