"""The one kind of thread the project starts besides the heartbeat: it watches a wait that may never end from outside
it."""

import sys
import threading
import traceback
from collections.abc import Callable


def watch(look: Callable[[], object], stop: threading.Event) -> threading.Thread:
    """Call `look` every second, in a thread named "watch", until `stop` is set.

    A wait inside C code (the processes meeting in `init_process_group`, a store call to a frozen holder) may last
    without end whatever its timeout says, and Python runs nothing of that thread meanwhile. `look` reads the clock
    and says, or reads a store and ends the process; a `look` whose store call may itself wait without end (a
    client at a port another program holds) has a watch of its own, so that it silences no other.
    """

    def run() -> None:
        try:
            while not stop.wait(1.0):
                look()
        except Exception:  # a bug: said with its cause; what it watched is no longer watched, the process goes on
            print(f"error in the watch thread (a bug):\n{traceback.format_exc()}", file=sys.stderr, flush=True)

    thread = threading.Thread(target=run, name="watch", daemon=True)
    thread.start()
    return thread
