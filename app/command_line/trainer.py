"""The Trainer the command line builds: Lightning's, reading a whole number of batches as batches."""

from lightning.pytorch import Trainer as LightningTrainer


class Trainer(LightningTrainer):
    """Lightning's Trainer, whose `limit_*_batches` and `overfit_batches` take a whole number as a number of batches
    from the command line and config files too, as `Trainer(limit_val_batches=1)` does in Python.

    (Annotated `float | int` by Lightning, `--trainer.limit_val_batches 1` became 1.0: all the batches.)"""

    def __init__(
        self,
        *args,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        overfit_batches: int | float = 0.0,
        **kwargs,
    ) -> None:
        super().__init__(
            *args,
            limit_train_batches=limit_train_batches,
            limit_val_batches=limit_val_batches,
            limit_test_batches=limit_test_batches,
            limit_predict_batches=limit_predict_batches,
            overfit_batches=overfit_batches,
            **kwargs,
        )
