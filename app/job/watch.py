"""The one kind of thread the project starts: it watches from outside what may wait without end, and counts the
heartbeat."""

import sys
import threading
import traceback
from collections.abc import Callable


def watch(
    look: Callable[[], object],
    stop: threading.Event,
    every_s: float = 1.0,
    name: str = "watch thread",
    on_error: Callable[[], object] = lambda: None,
) -> threading.Thread:
    """Call `look` at once, then every `every_s` seconds, in a thread named `name`, until `stop` is set.

    A wait inside C code (the processes meeting in `init_process_group`, a store call to a frozen holder) may last
    without end whatever its timeout says, and Python runs nothing of that thread meanwhile. `look` reads the clock
    and says, or reads a store and ends the process; a `look` whose store call may itself wait without end (a
    client at a port another program holds) has a watch of its own, so that it silences no other. An error of
    `look` (a bug) is said with its cause, then `on_error` runs: what it watched is no longer watched, and the
    process goes on.
    """

    def run() -> None:
        try:
            while not stop.is_set():
                look()
                stop.wait(every_s)
        except Exception:
            if not stop.is_set():
                said = "a bug; what it watched is no longer watched, and the process goes on"
                print(f"error in the {name} ({said}):\n{traceback.format_exc()}", file=sys.stderr, flush=True)
                on_error()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
