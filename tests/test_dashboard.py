"""The dashboard's speed scalars, in-process: one point per optimizer step at most, timing whole steps."""

import time

from lightning.pytorch import Callback, Trainer

from app.callbacks import Dashboard
from datamodules import MNISTDataModule
from models import SeqNet

BATCH_S = 0.05  # each batch takes at least this long


class SlowBatches(Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        time.sleep(BATCH_S)  # a workload of known length, not a wait for something


def test_the_step_time_is_logged_once_per_optimizer_step_under_gradient_accumulation(data_dir, tmp_path):
    trainer = Trainer(
        accelerator="cpu",
        max_steps=4,
        accumulate_grad_batches=3,  # 12 batches, 4 optimizer steps
        log_every_n_steps=1,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        logger=False,
        callbacks=[Dashboard(), SlowBatches()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model, speeds = SeqNet(), []
    log_dict = model.log_dict

    def speed_logged(metrics, *args, **kwargs):  # what the dashboard gives Lightning to log, and when
        if "workload/step_ms" in metrics:
            speeds.append((model.trainer.global_step, metrics["workload/step_ms"]))
        log_dict(metrics, *args, **kwargs)

    model.log_dict = speed_logged
    trainer.fit(model, MNISTDataModule(data_dir=str(data_dir), batch_size=10, val_size=200))
    assert [step for step, _ in speeds] == [1, 2, 3, 4]
    assert all(step_ms >= 3 * BATCH_S * 1000 for _, step_ms in speeds), speeds  # 3 batches a step
