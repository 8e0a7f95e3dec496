"""Train and test an image classifier with PyTorch Lightning and DDP. `python train.py --help` says how."""

import gc

# Importing torch, Lightning, torchvision and torchmetrics creates about a million objects that live as long as the
# program. With the garbage collector on, Python scans them over and over while importing (a second of start-up on
# 2 cores, in every process) and once more at exit (another second). Off while importing, then frozen: never scanned.
gc.disable()

import signal  # noqa: E402
import sys  # noqa: E402

from app.command_line.quiet import silence_the_shutdown  # noqa: E402
from app.job.early_start import NodeProcesses  # noqa: E402
from app.job.network import die_with_parent  # noqa: E402

silence_the_shutdown()  # first, so that it comes last: the frozen objects below are never freed

die_with_parent()  # before the slow imports below, while the launcher that started this process surely lives
node = NodeProcesses.start(sys.argv[1:])  # --devices N: the other processes import what follows at the same time

try:
    from app.main import main
except KeyboardInterrupt:  # Ctrl-C while importing: stopped, as after it, with no traceback from every process
    sys.exit(128 + signal.SIGINT)

gc.freeze()
gc.enable()

if __name__ == "__main__":
    main(node=node)  # exits with a non-zero status on errors
