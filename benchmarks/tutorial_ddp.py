"""The tutorial program that train.py replaces, re-created for `end_to_end.py` to time against it.

What the DDP tutorial does, in its order: `torch.multiprocessing.spawn` starts one process per device; each sets
MASTER_ADDR/MASTER_PORT and calls `init_process_group("gloo")`; torchvision's dataset with `ToTensor()` (a PIL
image per sample) feeds a `DataLoader` with a `DistributedSampler`, `pin_memory=True` and 100 samples per batch;
the MLP (784 -> 200 -> 200 -> 10, sigmoid) trains with Adam, lr 0.01, cross-entropy; rank 0 prints each epoch's
last loss and, at the end, evaluates the test set on its own. Kept as the tutorial has them: the division by 255
after `ToTensor()`, the `log_softmax` between the second and the third layer, no `sampler.set_epoch`, no thread
setting (torch's default, all cores per process).

Where it differs from the tutorial: the data folder and the dataset are arguments (the tutorial downloads
FashionMNIST); `--model convnet` swaps in the network of `models/convnet.py`, written out here, so that the
ConvNet rows compare the two programs on the same network; `--epochs` and `--batch-size` are arguments. Rank 0
evaluates with the network inside the DDP wrapper (`model.module`), where the tutorial calls the wrapper: for the
MLP that is the same, but with ConvNet's BatchNorm buffers the wrapper's forward broadcasts them from rank 0, a
collective that the other ranks, finished, never join (the run died with "Connection reset by peer"). It stamps
the moments of its start-up for `startup.py` (`startup_stamps.py`; nothing without `STARTUP_STAMPS` set).

    python benchmarks/tutorial_ddp.py --data-dir ../shared/datasets --dataset mnist --processes 2 --epochs 10
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from startup_stamps import set_rank, stamp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms

stamp("imported")  # for startup.py; in the processes that mp.spawn starts too, which import this module again


class SeqNet(nn.Module):
    """The tutorial's MLP, bugs included."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(784, 200)
        self.lin2 = nn.Linear(200, 200)
        self.lin3 = nn.Linear(200, 10)

    def forward(self, x):
        x = x / 255.0
        x = x.view(-1, 28 * 28)
        x = torch.sigmoid(self.lin1(x))
        x = F.log_softmax(torch.sigmoid(self.lin2(x)), dim=1)
        return self.lin3(x)


def convnet() -> nn.Module:
    """The network of models/convnet.py."""

    def block(in_channels: int, out_channels: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3), nn.BatchNorm2d(out_channels), nn.ReLU(), nn.MaxPool2d(2)
        )

    return nn.Sequential(block(1, 32), block(32, 64), nn.Flatten(), nn.Linear(1600, 128), nn.ReLU(), nn.Linear(128, 10))


def train(rank: int, args: argparse.Namespace, device: torch.device) -> None:
    set_rank(rank)
    stamp("built")  # nothing to build before the meeting: the program builds after it
    stamp("meeting")
    if device.type == "cuda":  # torchrun set the address, the port, the rank and the world size
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(args.port)
        dist.init_process_group("gloo", rank=rank, world_size=args.processes)
    stamp("met")

    dataset_class = datasets.MNIST if args.dataset == "mnist" else datasets.FashionMNIST
    train_set = dataset_class(args.data_dir, train=True, download=True, transform=transforms.ToTensor())
    sampler = DistributedSampler(train_set, num_replicas=dist.get_world_size(), rank=rank)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, pin_memory=True)

    network = (SeqNet() if args.model == "seqnet" else convnet()).to(device)
    model = DistributedDataParallel(network, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            stamp("first step")
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)

    if rank == 0:
        test_set = dataset_class(args.data_dir, train=False, download=True, transform=transforms.ToTensor())
        correct = 0
        network = model.module  # not the DDP wrapper: see the module's docstring
        network.eval()
        with torch.no_grad():
            for images, labels in DataLoader(test_set, batch_size=args.batch_size):
                images, labels = images.to(device), labels.to(device)
                correct += (network(images).argmax(dim=1) == labels).sum().item()
        print(f"test accuracy {correct / len(test_set):.4f}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--dataset", default="fashion_mnist", choices=["mnist", "fashion_mnist"])
    parser.add_argument("--model", default="seqnet", choices=["seqnet", "convnet"])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--port", type=int, default=29500)
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:  # started by torchrun: one process of the GPU program
        train(int(os.environ["RANK"]), args, torch.device("cuda", int(os.environ["LOCAL_RANK"])))
    else:
        mp.spawn(train, args=(args, torch.device("cpu")), nprocs=args.processes)


if __name__ == "__main__":
    main()
