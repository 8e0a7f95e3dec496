"""What `train.py` runs: its command line through TrainCLI (or `export`), every mistake in one line, and the exit
status a shell, torchrun or SLURM reads."""

import os
import signal
import sys

from lightning.pytorch.utilities.exceptions import SIGTERMException

from app.command_line.argv import parse_command, subcommand_of
from app.command_line.errors import PEER_LOST, PEER_LOST_MESSAGE, RENDEZVOUS_ERRORS, USER_ERRORS, describe
from app.command_line.quiet import silence_noise
from app.command_line.speaking import TRACEBACK_WANTED, exit_with_bug, exit_with_error
from app.command_line.train_cli import TrainCLI
from app.job.early_start import NodeProcesses
from app.job.network import choose_socket_interface
from app.job.node_loss import note_the_loss
from app.job.process_group import close_process_group
from app.run.export import ExportError, export
from app.run.export import parse as parse_export_arguments

__all__ = ["main", "parse_command"]


def main(argv: list[str] | None = None, node: NodeProcesses | None = None) -> None:
    """Run `train.py ARGV`; `node`: the processes of this node that train.py started first thing (none by default)."""
    argv = sys.argv[1:] if argv is None else argv
    node = node or NodeProcesses()
    if argv[:1] == ["export"]:
        export_model(argv[1:], node)
        return
    args, test_after_fit = parse_command(argv)
    silence_noise(subcommand_of(args))
    interface = choose_socket_interface()
    if interface and os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")) == "0":  # once per node
        print(f"Reaching MASTER_ADDR through {interface} (set GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME to choose)")
    try:
        cli = TrainCLI(args, test_after_fit, node)
    except SIGTERMException as stop:  # every rank stopped at the same step (app/job/fault_guard.py: FaultGuard)
        # 143 or 130: what shells, torchrun and SLURM read as "ended by SIGTERM" or "by Ctrl-C"
        sys.exit(128 + getattr(stop, "signum", signal.SIGTERM))
    except KeyboardInterrupt:  # Ctrl-C before training started or after it ended
        sys.exit(128 + signal.SIGINT)
    except Exception as error:
        if TRACEBACK_WANTED:
            raise
        if isinstance(error, (*USER_ERRORS, *RENDEZVOUS_ERRORS)):
            exit_with_error(describe(error, args), node)
        if PEER_LOST.search(str(error)):  # usually said once the process that failed first has said why
            note_the_loss()  # for the attempt an elastic launcher starts next
            exit_with_error(PEER_LOST_MESSAGE, node)
        exit_with_bug(error, node)
    finally:
        node.leaving.set()  # from here, a process of this node that fails is not waited for (early_start.py)
        close_process_group(node)
    node.wait_for_the_others(cli.processes_started_here())


def export_model(argv: list[str], node: NodeProcesses) -> None:
    """`train.py export ...` (app/run/export.py), with its mistakes in one line."""
    try:
        output = export(parse_export_arguments(argv))
    except Exception as error:
        if TRACEBACK_WANTED:
            raise
        if isinstance(error, (ExportError, *USER_ERRORS)):
            exit_with_error(describe(error), node)
        exit_with_bug(error, node)
    print(f"Exported: {output}")
