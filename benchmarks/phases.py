"""Where a train.py run spends its wall time: a Lightning profiler that sorts every moment of rank 0 into a phase.

`end_to_end.py` passes it to train.py as `--trainer.profiler benchmarks.phases.PhaseProfiler`. Lightning already
wraps every hook, training step and checkpoint save in `profiler.profile(name)`; this profiler only looks at the
names and charges the time since the last change to the phase running then:

- start-up: from the moment the benchmark started the command (environment variable `E2E_T0`) to the first
  training step, less the sanity check's validation;
- training: from the first training step on, whatever no other phase claims;
- validation and test: from the model's switch to eval mode to the end of the stage's last `on_*_end` hook;
- dashboard: any hook of the `Dashboard` callback; checkpoints: any hook of a `ModelCheckpoint` and every
  `trainer.save_checkpoint`;
- other: from the end of a stage (fit) to the next phase (in the test, after loading the best checkpoint).

It also keeps the moment each training step starts: the median time between two of them, past the first 20
(`step_ms`), is the steady step as train.py runs it, with its hooks, logging and progress bar. On a GPU the host runs
ahead of the device, so that is the host's time per step or the device's, whichever is longer.

The end of each stage (fit, test) writes the totals so far as JSON to `E2E_PHASES` on local rank 0.
"""

import itertools
import json
import os
import statistics
import time
from pathlib import Path

from lightning.pytorch.profilers import Profiler
from typing_extensions import override


def phase_of(action: str) -> str | None:
    """The phase that an action (a name Lightning profiles) opens, or None."""
    if action.startswith("[Callback]Dashboard"):
        return "dashboard"
    if action.startswith("[Callback]ModelCheckpoint") or action == "save_checkpoint":
        return "checkpoints"
    if action.endswith(".on_validation_model_eval"):
        return "validation"
    if action.endswith(".on_test_model_eval"):
        return "test"
    return None


def closes_stage(action: str) -> bool:
    """Whether the end of this action closes a validation or test phase: the module's last hook of the stage."""
    return action.startswith("[LightningModule]") and action.endswith((".on_validation_end", ".on_test_end"))


class PhaseProfiler(Profiler):
    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[str, float] = {}
        self.stack = ["start-up"]  # the phase running now is the last; the first is start-up or training
        self.closing_actions: list[str] = []  # for each phase pushed by a hook, the action whose end pops it
        self.last = float(os.environ.get("E2E_T0", time.time()))
        self.first_step: float | None = None
        self.step_starts: list[float] = []

    def _switch(self) -> None:
        now = time.time()
        self.seconds[self.stack[-1]] = self.seconds.get(self.stack[-1], 0.0) + now - self.last
        self.last = now

    @override
    def start(self, action_name: str) -> None:
        if action_name == "run_training_batch":
            self.step_starts.append(time.perf_counter())
        if action_name == "run_training_batch" and self.first_step is None:
            self._switch()
            self.first_step = self.last
            self.stack[0] = "training"
            return
        phase = phase_of(action_name)
        if phase is None:
            return
        self._switch()
        self.stack.append(phase)
        self.closing_actions.append(action_name if phase in ("dashboard", "checkpoints") else "stage end")

    @override
    def stop(self, action_name: str) -> None:
        closing = self.closing_actions[-1] if self.closing_actions else None
        if action_name == closing or (closing == "stage end" and closes_stage(action_name)):
            self._switch()
            self.stack.pop()
            self.closing_actions.pop()

    @override
    def summary(self) -> str:
        return ""

    @override
    def describe(self) -> None:
        """Lightning calls this at the end of each stage (fit, test)."""
        path = os.environ.get("E2E_PHASES")
        if path and self.local_rank == 0:
            self._switch()
            steps = self.step_starts[20:]
            gaps = [b - a for a, b in itertools.pairwise(steps)]
            step_ms = statistics.median(gaps) * 1000 if gaps else None
            profile = {"seconds": self.seconds, "first_step": self.first_step, "step_ms": step_ms}
            Path(path).write_text(json.dumps(profile))
        self.stack, self.closing_actions = ["other"], []  # until the next stage's phases: loading a checkpoint, say
