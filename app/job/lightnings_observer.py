"""Lightning's watch over the processes its launcher started, stood down once the processes of the job have met.

Under Lightning's launcher (`--devices auto` on a GPU machine, a cluster environment given), the process that
started the others runs a thread that looks at them every 5 s and, once one has ended with a non-zero status, kills
them all and its own process with SIGKILL. Before the processes meet, that ends a process blocked in
`init_process_group` by one that died while starting. Once they have met, this program does it itself, in one line:
a process that fails says why once (`app/command_line/speaking.py`), the others meet the loss at their next
collective on gloo, or are ended by `NodeProcesses.watch_after_the_meeting` where a collective waits on (NCCL), one
that stops answering is named by the heartbeats (`app/job/heartbeats.py`), one that fails at exit is named by
`NodeProcesses.wait_for_the_others`. The SIGKILL raced each of them: 0-5 s after a process ended, whatever this one
was doing, it was killed without its exit (the loggers not written out, the failed process not named, exit status
137 instead of 1). The early start's processes are watched the same way (`NodeProcesses._watch`).
"""

import subprocess
import threading

# Private: Lightning offers no public way to stop the thread or to launch without it (2.5, 2.6);
# tests/test_private_names.py checks that both names are still where this reads them.
from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver


def stand_down_lightnings_observer() -> list[subprocess.Popen]:
    """In the process that Lightning's launcher started the others from, once they have met: with nothing left to
    watch, Lightning's thread finds nothing failed at its next look and ends. Returns the processes it watched, for
    this program's own watch (`NodeProcesses.watch_after_the_meeting`); none in every other process, and the next
    time."""
    taken: list[subprocess.Popen] = []
    for thread in threading.enumerate():
        if isinstance(thread, _ChildProcessObserver):
            taken += thread._child_processes
            thread._child_processes = []
    return taken
