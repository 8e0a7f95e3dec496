"""Time to accuracy: training wall time until the test accuracy reaches a target, through this project's path.

For each epoch budget E (smallest first) the model trains E epochs with the project's defaults (Adam, one-cycle
schedule over the whole run), then is tested; the first budget that reaches the target is the answer. The time
is the wall time of `fit` from the first training step to the last (Lightning's `on_train_start` to
`on_train_end`), without validation (`limit_val_batches=0`): process start, data loading and testing excluded.

    python benchmarks/time_to_accuracy.py --data-dir ../shared/datasets --model ConvNet --target 0.99 --devices 2
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from lightning.pytorch import Callback, seed_everything  # noqa: E402

from benchmarks.bare_trainer import bare_trainer  # noqa: E402
from datamodules import MNISTDataModule  # noqa: E402
from models import ConvNet, SeqNet  # noqa: E402


class FitClock(Callback):
    """Wall time from the first to the last training step, the device synchronised at both ends."""

    def on_train_start(self, trainer, pl_module):
        self._sync(pl_module)
        self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        self._sync(pl_module)
        self.seconds = time.perf_counter() - self.start

    @staticmethod
    def _sync(pl_module):
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/datasets", help="folder holding MNIST/raw/")
    parser.add_argument("--model", default="ConvNet", choices=["SeqNet", "ConvNet"])
    parser.add_argument("--target", type=float, default=0.99, help="test accuracy to reach")
    parser.add_argument("--epochs", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="budgets to try, in order")
    parser.add_argument("--devices", default="auto")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--batch-size", type=int, default=64, help="per device")
    parser.add_argument("--lr", type=float, default=0.01, help="peak of the one-cycle schedule")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--on-device", action="store_true", help="train.py's --data.on_device true")
    parser.add_argument("--precision", default="32-true", help="train.py's --trainer.precision")
    args = parser.parse_args()

    model_class = {"SeqNet": SeqNet, "ConvNet": ConvNet}[args.model]
    for epochs in args.epochs:
        seed_everything(args.seed, verbose=False)
        clock = FitClock()
        trainer = bare_trainer(
            accelerator=args.accelerator,
            devices=args.devices,
            max_epochs=epochs,
            callbacks=[clock],
            precision=args.precision,
        )
        datamodule = MNISTDataModule(
            dataset="mnist", data_dir=args.data_dir, batch_size=args.batch_size, on_device=args.on_device
        )
        model = model_class(optimizer=lambda params: torch.optim.Adam(params, lr=args.lr, fused=True))
        trainer.fit(model, datamodule=datamodule)
        (results,) = trainer.test(model, datamodule=datamodule, verbose=False)
        reached = results["test/acc"] >= args.target
        if trainer.is_global_zero:
            device = str(trainer.strategy.root_device)
            line = {"model": args.model, "epochs": epochs, "train_seconds": round(clock.seconds, 2)}
            line |= {"batch": args.batch_size, "lr": args.lr, "seed": args.seed, "precision": args.precision}
            line |= {"test_acc": round(results["test/acc"], 4), "target": args.target, "reached": reached}
            print(json.dumps(line | {"processes": trainer.world_size, "device": device}), flush=True)
        if reached:
            break
    if dist.is_initialized():  # as train.py does: else gloo's threads may abort the process at its exit
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
