"""Test accuracy after a number of training steps, for choosing a recipe: train.py's arithmetic in a plain loop.

The net (`ConvNet` of the sizes given, normalising raw pixels itself), Adam with the betas given, torch's
`OneCycleLR` over the steps (momentum cycled or not, as `--model.cycle_momentum`), the training split of the
datamodule (55,000 images: 5,000 held out) re-shuffled each epoch, then the official test set. No Lightning, so
that a search runs fast on a CPU: accuracy after N steps does not depend on the loop that runs them (up to the
order of the batches, which a seed sets differently here). `configs/convnet_fast_gpu.yaml` was chosen with it
(benchmarks/README.md, "Round 3 on an H200").

    python benchmarks/recipe_search.py --data-dir ../shared/datasets --batch-size 512 --lr 0.02 --steps 216
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datamodules import MNISTDataModule  # noqa: E402
from models import ConvNet  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/datasets", help="folder holding MNIST/raw/")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.02, help="peak of the one-cycle schedule")
    parser.add_argument("--betas", type=float, nargs=2, default=[0.7, 0.9])
    parser.add_argument("--cycle-momentum", action="store_true", help="cycle Adam's first beta (train.py's default)")
    parser.add_argument("--steps", type=int, default=216, help="optimizer steps (two epochs at batch 512: 216)")
    parser.add_argument("--channels", type=int, nargs=2, default=[24, 32])
    parser.add_argument("--kernel-sizes", type=int, nargs=2, default=[5, 3])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-norm", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    datamodule = MNISTDataModule(dataset="mnist", data_dir=args.data_dir)
    datamodule.setup("fit")
    datamodule.setup("test")
    train = [t.to(device) for t in datamodule.train_set.tensors]
    test = [t.to(device) for t in datamodule.test_set.tensors]
    sizes = {"channels": args.channels, "kernel_sizes": args.kernel_sizes, "hidden": args.hidden}
    for seed in args.seeds:
        start = time.perf_counter()
        torch.manual_seed(seed)
        model = ConvNet(**sizes, batch_norm=args.batch_norm, pixel_mean=datamodule.mean, pixel_std=datamodule.std)
        model.configure_model()
        model.to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=tuple(args.betas))
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=args.lr, total_steps=args.steps, cycle_momentum=args.cycle_momentum
        )
        for images, targets in batches(train, args.batch_size, args.steps, seed):
            loss = F.cross_entropy(model(images), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        model.eval()
        with torch.no_grad():
            pairs = zip(test[0].split(2000), test[1].split(2000), strict=True)
            correct = sum((model(x).argmax(1) == y).sum().item() for x, y in pairs)
        line = {**vars(args), "seed": seed, "test_acc": correct / len(test[0])}
        print(json.dumps(line | {"seconds": round(time.perf_counter() - start, 1)}), flush=True)


def batches(split: list[torch.Tensor], batch_size: int, steps: int, seed: int):
    """`steps` batches, epoch after epoch, each epoch in a fresh order (the last short batch of an epoch too)."""
    generator, given = torch.Generator().manual_seed(seed), 0
    while True:
        for index in torch.randperm(len(split[0]), generator=generator).split(batch_size):
            if given == steps:
                return
            given += 1
            index = index.to(split[0].device)
            yield split[0][index], split[1][index]


if __name__ == "__main__":
    main()
