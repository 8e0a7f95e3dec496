"""What `train.py` runs: TrainCLI (or `export`), every mistake in one line, and the exit status: 0; 1 after a mistake
or a bug; after Ctrl-C or SIGTERM, an end by that very signal, so that a shell loop stops (130 and 143)."""

import os
import signal
import sys
from typing import NoReturn

from app.command_line.argv import parse_command, subcommand_of
from app.command_line.errors import (
    PEER_LOST,
    PEER_LOST_MESSAGE,
    RENDEZVOUS_ERRORS,
    USER_ERRORS,
    WORKER_KILLED,
    WORKER_KILLED_HINT,
    describe,
    one_line,
)
from app.command_line.quiet import silence_noise
from app.command_line.speaking import TRACEBACK_WANTED, bug_report, error_line, report
from app.command_line.train_cli import STOPS, TrainCLI
from app.job.children import end_after_the_first_process, wait_for_the_others
from app.job.network import choose_socket_interface
from app.job.process_group import close_process_group, have_met
from app.run.export import ExportError, export
from app.run.export import parse as parse_export_arguments


def main(argv: list[str] | None = None) -> None:
    """Run `train.py ARGV` (the process's own command line by default), and end as the module says."""
    try:
        status, met = run(sys.argv[1:] if argv is None else argv)
        if status != 0 and met:  # before the meeting, the first process waits for this one: no sense in waiting
            end_after_the_first_process()
    except KeyboardInterrupt:  # Ctrl-C while this process says why it failed, or waits to end
        status = -signal.SIGINT
    if status != 0:
        end(status)


def run(argv: list[str]) -> tuple[int, bool]:
    """Run the command: its exit status (or minus the number of the signal that stopped it), and whether the processes
    of the job had met."""
    args = argv
    try:
        if argv[:1] == ["export"]:
            print(f"Exported: {export(parse_export_arguments(argv[1:]))}")
            return 0, False
        args, test_after_fit = parse_command(argv)
        silence_noise(subcommand_of(args))
        interface = choose_socket_interface()
        if interface and os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")) == "0":  # once a node
            print(f"Reaching MASTER_ADDR through {interface} (set GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME to choose)")
        cli = TrainCLI(args, test_after_fit)
        close_process_group()
        return wait_for_the_others(cli.processes_started_here()), True
    except STOPS as stop:  # every rank stopped at the same step, or Ctrl-C before training started or after it
        default = signal.SIGINT if isinstance(stop, KeyboardInterrupt) else signal.SIGTERM
        return -getattr(stop, "signum", default), have_met()
    except Exception as error:
        if TRACEBACK_WANTED:
            raise
        met = have_met()
        report(_what_went_wrong(error, args))
        return 1, met
    finally:
        close_process_group()


def _what_went_wrong(error: Exception, args: list[str]) -> str:
    """A mistake in one line; a bug with a short traceback."""
    if isinstance(error, (*USER_ERRORS, *RENDEZVOUS_ERRORS, ExportError)):
        return error_line(describe(error, args))
    if PEER_LOST.search(str(error)):  # usually said once the process that failed first has said why
        return error_line(PEER_LOST_MESSAGE)
    if WORKER_KILLED.search(str(error)):  # a fault of the machine, not a bug: what was saved stays
        return error_line(f"{one_line(error)} {WORKER_KILLED_HINT}")
    return bug_report(error)


def end(status: int) -> NoReturn:
    """End the process with `status`; with minus a signal's number, by that signal (exit handlers do not run then:
    what a stop keeps was written before)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status if status > 0 else 128 - status)  # as a shell reports a signal, should the kill not end it
