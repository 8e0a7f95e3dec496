"""GracefulStop in a Trainer of one's own: one process, and two gloo processes the test starts itself."""

import inspect
import json
import math
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from app.callbacks.graceful_stop import GracefulStop, Stopped
from app.console import UserError
from app.plugins.rendezvous import RendezvousDDPStrategy
from datamodules import MNISTDataModule
from models import SeqNet
from tests.helpers import ended, job
from tests.instruments import DivergeInEpoch, SignalAt

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def fit(
    data_dir: Path, folder: Path, *callbacks: Callback, devices: int = 1, before: tuple = (), **settings
) -> tuple[Trainer, Stopped]:
    """Fit a SeqNet on the synthetic MNIST (20 steps an epoch on one process) with a GracefulStop checking every 5
    steps and saving last.ckpt in `folder`, and `callbacks` after it (`before`: before it); what stopped it (None
    where nothing did)."""
    last = ModelCheckpoint(dirpath=folder, filename="last", enable_version_counter=False)
    stop = GracefulStop(every_n_steps=5, checkpoint=last)
    strategy = RendezvousDDPStrategy() if devices > 1 else "auto"
    settings = {"max_epochs": 2, **settings}
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*before, last, stop, *callbacks],
        default_root_dir=folder,
        **settings,
    )
    data = MNISTDataModule(dataset="mnist", data_dir=str(data_dir), val_size=200, batch_size=50)
    try:
        trainer.fit(SeqNet(), datamodule=data)
    except Stopped as stopped:
        return trainer, stopped
    return trainer, None


def saved_step(folder: Path) -> int:
    return torch.load(folder / "last.ckpt", map_location="cpu", weights_only=True)["global_step"]


def test_a_sigterm_stops_at_the_next_check_keeping_that_step_and_the_handlers_act_as_before(data_dir, tmp_path):
    received = []
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    before = {signum: signal.getsignal(signum) for signum in SIGNALS}
    _trainer, nothing = fit(data_dir, tmp_path / "well", max_epochs=1)  # a fit that ends well: handlers put back
    assert nothing is None and {signum: signal.getsignal(signum) for signum in SIGNALS} == before

    trainer, stopped = fit(data_dir, tmp_path, SignalAt(signal.SIGTERM, step=3))
    assert stopped.signum == signal.SIGTERM and stopped.checkpoint == str(tmp_path / "last.ckpt")
    assert trainer.global_step == 5 and saved_step(tmp_path) == 5 and received == []
    # After a stage that ended in an exception, Lightning puts back the handlers it found as the loops began (this
    # one's): idle, each acts as the one before it, and gives it its place back.
    os.kill(os.getpid(), signal.SIGTERM)
    assert received == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    assert {signum: signal.getsignal(signum) for signum in SIGNALS} == {
        **before,
        signal.SIGHUP: signal.getsignal(signal.SIGHUP),
    }


def test_one_ctrl_c_delivered_twice_is_one_press_and_a_second_press_stops_at_once(data_dir, tmp_path):
    class Presses(Callback):
        """Ctrl-C after step 1, once more at once (a terminal passing one press on twice) or a second later."""

        def __init__(self, gap: float) -> None:
            self.gap = gap

        def on_train_batch_end(self, trainer, *args) -> None:
            if trainer.global_step == 1:
                stop = next(c for c in trainer.callbacks if isinstance(c, GracefulStop))
                os.kill(os.getpid(), signal.SIGINT)
                deadline = time.monotonic() + self.gap
                while stop.signal is None or time.monotonic() < deadline:  # the handler runs between two lines
                    pass
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)

    trainer, stopped = fit(data_dir, tmp_path / "twice", Presses(gap=0.0))
    assert stopped.signum == signal.SIGINT and trainer.global_step == 5 and saved_step(tmp_path / "twice") == 5
    trainer, stopped = fit(data_dir, tmp_path / "again", Presses(gap=1.05))
    assert stopped.signum == signal.SIGINT and stopped.checkpoint is None and trainer.global_step == 1
    assert not (tmp_path / "again" / "last.ckpt").exists()


def test_a_signal_before_the_loops_stops_as_they_start_and_one_in_an_evaluation_at_once(data_dir, tmp_path):
    trainer, stopped = fit(data_dir, tmp_path, SignalAt(signal.SIGHUP, step=-1))
    assert stopped.signum == signal.SIGHUP and trainer.global_step == 0 and not (tmp_path / "last.ckpt").exists()
    trainer, _ = fit(data_dir, tmp_path, max_epochs=1)
    stop = next(c for c in trainer.callbacks if isinstance(c, GracefulStop))
    trainer.callbacks.append(SignalAt(signal.SIGTERM, step=-2))
    with pytest.raises(Stopped) as stopped:
        trainer.test(datamodule=trainer.datamodule, ckpt_path=str(tmp_path / "last.ckpt"), weights_only=True)
    assert stopped.value.signum == signal.SIGTERM and stop.signal is None

    class SignalInsideInspect(Callback):
        """SIGTERM as the test runs library code that turns any Exception into its own (`inspect.getfullargspec`:
        `TypeError: unsupported callable`): the stop, a SystemExit, goes through."""

        def on_test_batch_start(self, *args) -> None:
            class Signalled:
                def __call__(self) -> None: ...

                @property
                def __signature__(self) -> None:
                    os.kill(os.getpid(), signal.SIGTERM)
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:  # the handler runs between two lines
                        pass

            inspect.getfullargspec(Signalled())

    trainer.callbacks[-1] = SignalInsideInspect()
    with pytest.raises(Stopped) as stopped:
        trainer.test(datamodule=trainer.datamodule, ckpt_path=str(tmp_path / "last.ckpt"), weights_only=True)
    assert stopped.value.signum == signal.SIGTERM


def test_a_hang_up_ignored_as_under_nohup_stays_ignored(data_dir, tmp_path):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    trainer, stopped = fit(data_dir, tmp_path, SignalAt(signal.SIGHUP, step=3), max_epochs=1)
    assert stopped is None and trainer.global_step == 20
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN


def test_a_non_finite_loss_stops_before_a_checkpoint_holds_the_diverged_weights(data_dir, tmp_path):
    with pytest.raises(
        UserError, match=r"the training loss became NaN or infinite by step 2[1-5] \(epoch 1\)"
    ) as error:
        fit(data_dir, tmp_path, DivergeInEpoch(epoch=1))
    assert error.value.every_process and f"{tmp_path / 'last.ckpt'} keeps the weights from before" in str(error.value)
    saved = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] == 20 and all(torch.isfinite(t).all() for t in saved["state_dict"].values())


def _fit_and_say(rank: int, data_dir: Path, folder: Path) -> None:
    """One process of a two-process job: SIGTERM reaches global rank 1 alone, after step 3."""
    trainer, stopped = fit(data_dir, folder, SignalAt(signal.SIGTERM, step=3, rank=1), devices=2)
    said = {
        "step": trainer.global_step,
        "signum": stopped and stopped.signum,
        "checkpoint": stopped and stopped.checkpoint,
    }
    (folder / f"rank{rank}.json").write_text(json.dumps(said))


def test_a_signal_that_reached_one_process_stops_both_at_one_step(data_dir, tmp_path):
    assert ended(job(_fit_and_say, 2, data_dir, tmp_path, folder=tmp_path)) == [0, 0]
    said = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert said[0] == said[1] == {"step": 5, "signum": signal.SIGTERM, "checkpoint": str(tmp_path / "last.ckpt")}
    assert saved_step(tmp_path) == 5


def test_every_steps_loss_counts_and_no_step_waits_for_it(data_dir, tmp_path):
    """The non-finite flag is kept from every step's loss (a NaN in a step between two checks is not missed), on the
    device: read at the checks only."""

    class NanOnce(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step == 2:
                outputs["loss"] = torch.tensor(math.nan)

    with pytest.raises(UserError, match="by step 5 "):
        fit(data_dir, tmp_path, before=(NanOnce(),))


def test_with_a_time_budget_every_callback_is_set_up_once_and_a_stop_without_a_checkpoint_is_lightnings(
    data_dir, tmp_path
):
    """GracefulStop moves itself after Lightning's Timer as the Trainer sets the callbacks up: the ones after it are
    set up all the same (the stall watchdog's thread starts there). With no checkpoint to keep the step, the budget's
    end is Lightning's own: the fit ends."""

    class SetUp(Callback):
        calls = 0

        def setup(self, trainer, pl_module, stage):
            SetUp.calls += 1

    class Spent(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 3:
                trainer.should_stop = True  # as the Timer does when the budget is spent

    trainer, stopped = fit(data_dir, tmp_path, SetUp(), max_time="00:01:00:00")
    assert SetUp.calls == 1 and stopped is None
    assert [type(c).__name__ for c in trainer.callbacks].index("GracefulStop") > [
        type(c).__name__ for c in trainer.callbacks
    ].index("Timer")
    stop = GracefulStop(every_n_steps=5)  # no checkpoint
    trainer = Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, max_epochs=2,
        max_time="00:01:00:00", callbacks=[Spent(), stop], default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(SeqNet(), datamodule=MNISTDataModule(dataset="mnist", data_dir=str(data_dir), val_size=200))
    assert trainer.global_step == 3 and trainer.state.status.value == "finished"


def test_a_signal_after_the_budgets_end_keeps_the_budgets_step_and_saves_no_more(data_dir, tmp_path):
    """What follows the budget's step (the epoch's end, its validation) trains nothing: the checkpoint saved at that
    step stays, unwritten, and the stop says that step."""

    class SpentThenSignal(Callback):
        kept: os.stat_result | None = None

        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 7:
                trainer.should_stop = True  # as the Timer does when the budget is spent

        def on_train_epoch_end(self, trainer, pl_module):
            self.kept = os.stat(tmp_path / "last.ckpt")
            os.kill(os.getpid(), signal.SIGTERM)

    spent = SpentThenSignal()
    trainer, stopped = fit(data_dir, tmp_path, spent, max_time="00:01:00:00")
    assert stopped is not None and stopped.signum == signal.SIGTERM and saved_step(tmp_path) == 7
    after = os.stat(tmp_path / "last.ckpt")
    assert (after.st_ino, after.st_mtime_ns) == (spent.kept.st_ino, spent.kept.st_mtime_ns)
