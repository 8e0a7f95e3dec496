"""StallWatchdog in a job of two processes started by the test: a frozen process is named (global rank 0 too), a job
where every process answers and none moves is named with where each stands, and the job ends."""

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from lightning.pytorch import Callback

from tests.helpers import ended, job, small_run, wait_for

pytestmark = pytest.mark.slow


class HoldRank0(Callback):
    """Global rank 0 waits before step 2 for what never comes; the other waits for it in the gradient all-reduce."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == 0 and trainer.global_step == 2:
            threading.Event().wait(60)


class SlowFirstStep(Callback):
    """The first training step takes 4 s (a model compiling), longer than the timeout, on every process; each writes
    `stepped<rank>` once it is done."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == 0:
            threading.Event().wait(4)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == 1:
            Path(trainer.default_root_dir, f"stepped{trainer.global_rank}").touch()


def _train(rank: int, args: list[str]) -> None:
    from train import main  # noqa: PLC0415

    main(args)


def run(data_dir: Path, tmp_path: Path, *more: str):
    args = small_run(
        data_dir,
        tmp_path,
        "--watchdog.timeout",
        "3",
        "--trainer.callbacks+=tests.instruments.RecordPid",
        *more,
        devices=2,
        max_epochs=100,
    )
    return job(_train, 2, args, folder=tmp_path)


def output(tmp_path: Path) -> str:
    return "".join((tmp_path / f"rank{rank}.log").read_text() for rank in (0, 1))


@pytest.mark.parametrize("frozen", [1, 0])
def test_a_frozen_process_is_named_by_the_other_and_the_job_ends(data_dir, tmp_path, frozen):
    processes = run(data_dir, tmp_path)
    pid = tmp_path / "pids" / f"rank{frozen}"
    wait_for(lambda: pid.exists() and (tmp_path / "pids" / f"rank{1 - frozen}").exists(), 120, "training to start")
    os.kill(int(pid.read_text()), signal.SIGSTOP)
    statuses = ended(processes, timeout=60)
    assert statuses[frozen] == -signal.SIGKILL and statuses[1 - frozen] == 1, (statuses, output(tmp_path)[-3000:])
    said = output(tmp_path)
    assert re.search(
        rf"^Global rank {frozen} \(pid {pid.read_text()} on .+\) gave no sign of life for 3 s: frozen,"
        " or its host hung or lost the network.$",
        said,
        re.MULTILINE,
    ), said[-3000:]
    assert said.count("error: a process of the job stopped answering, so the job ends") == 1


def test_a_job_whose_processes_all_answer_and_none_moves_is_named_where_each_stands(data_dir, tmp_path):
    statuses = ended(run(data_dir, tmp_path, "--trainer.callbacks+=tests.test_stall_watchdog.HoldRank0"), timeout=90)
    said = output(tmp_path)
    assert statuses == [1, 1], said[-3000:]
    assert (
        "No process of the job has finished a batch for 3 s: global rank 0 in fit (train), epoch 0, step 2;"
        " global rank 1 in fit (train), epoch 0, step 2." in said
    ), said[-3000:]
    assert said.count("error: the job's processes wait for each other and none moves, so the job ends") == 1


def test_a_slow_first_step_and_a_job_stopped_then_continued_are_no_stall(data_dir, tmp_path):
    """A compile of the first step longer than the timeout, and every process stopped (Ctrl-Z, a suspended SLURM job)
    for longer than it, then continued: the job trains on to its end."""
    slow = "--trainer.callbacks+=tests.test_stall_watchdog.SlowFirstStep"
    processes = run(data_dir, tmp_path, slow, "--trainer.max_epochs", "3")
    pids = [tmp_path / "pids" / f"rank{rank}" for rank in (0, 1)]
    wait_for(lambda: all((tmp_path / f"stepped{rank}").exists() for rank in (0, 1)), 120, "the first step")
    for pid in pids:
        os.kill(int(pid.read_text()), signal.SIGSTOP)
    resumed = time.monotonic() + 4
    wait_for(lambda: time.monotonic() > resumed, 10, "4 s stopped")
    for pid in pids:
        os.kill(int(pid.read_text()), signal.SIGCONT)
    assert ended(processes, timeout=90) == [0, 0], output(tmp_path)[-3000:]
    assert "error" not in output(tmp_path)
