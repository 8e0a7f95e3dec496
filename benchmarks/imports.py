"""Where the imports of train.py's start-up go, dependency by dependency (`python -X importtime`).

Each round runs `python -X importtime -c "import train"` in a fresh interpreter (what every process of a run does
before it parses the command line: train.py is the program) and adds up the time each module's own code took, by the
package it belongs to: a dependency's figure is its own modules, not what they import from other packages.
`--before PATH` runs another checkout (a `git worktree` of an earlier commit) in the same rounds; a checkout of the
layout before 2026-11-28 (with an `app/main.py`, which that train.py's `main()` imported with the collector off) runs
`import gc; gc.disable(); import train, app.main` instead. Medians over the rounds, in seconds.

    python benchmarks/imports.py
    python benchmarks/imports.py --before /tmp/before
"""

import argparse
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from end_to_end import print_machine

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {  # the name a row has, by top-level module
    **dict.fromkeys(("torch", "torchgen", "functorch"), "torch"),
    **dict.fromkeys(("lightning", "lightning_utilities", "lightning_fabric", "pytorch_lightning"), "lightning"),
    **dict.fromkeys(("torchvision", "torchmetrics", "torchdata", "jsonargparse", "tensorboard"), None),
    **dict.fromkeys(("triton", "sympy", "mpmath", "numpy", "PIL", "yaml", "google", "networkx", "jinja2"), None),
    **dict.fromkeys(("app", "models", "datamodules", "train"), "this program"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", type=Path, help="another checkout, run in the same rounds")
    args = parser.parse_args()
    checkouts = ({"before": args.before.resolve()} if args.before else {}) | {"now": REPO}

    print_machine()
    runs: dict[str, list[dict[str, float]]] = defaultdict(list)
    for _ in range(args.rounds):
        for label, checkout in checkouts.items():
            runs[label].append(import_times(checkout))
    rows = sorted(
        {row for times in runs["now"] for row in times},
        key=lambda row: -statistics.median(times.get(row, 0.0) for times in runs["now"]),
    )
    rounds = f"medians of {args.rounds} interleaved rounds"
    print(f"\nSeconds of train.py's imports (`{import_code(REPO)}`), each package's own modules, {rounds}")
    print(f"| package | {' | '.join(checkouts)} |")
    print(f"| --- | {' | '.join('---' for _ in checkouts)} |")
    for row in [*(row for row in rows if row not in ("other", "all")), "other", "all"]:
        cells = [f"{statistics.median(times.get(row, 0.0) for times in runs[label]):.3f}" for label in checkouts]
        print(f"| {row} | {' | '.join(cells)} |")


def import_code(checkout: Path) -> str:
    """What a process of train.py imports before it parses the command line, in `checkout`'s layout."""
    if (checkout / "app" / "main.py").is_file():  # the old layout: train.py's main() imported the program
        return "import gc; gc.disable(); import train, app.main"
    return "import train"


def import_times(checkout: Path) -> dict[str, float]:
    """Seconds spent in each package's own modules while train.py's imports (`import_code`) run in `checkout`."""
    # The checkout first; what PYTHONPATH already holds after it (packages carried there, as on a lent GPU machine).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", import_code(checkout)],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    times: dict[str, float] = defaultdict(float)
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, _, name = line.removeprefix("import time:").split("|")
        top = name.strip().split(".")[0]
        row = PACKAGES.get(top, "other") or top
        times[row] += int(own) / 1e6
        times["all"] += int(own) / 1e6
    return times


if __name__ == "__main__":
    main()
