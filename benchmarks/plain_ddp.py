"""The plain PyTorch DDP program that train.py replaces: the tutorial's training, done right, and nothing else.

Every step of distributed training written by hand, as the PyTorch DDP tutorials write it, with what they leave out
put in: `init_process_group`, a `DistributedSampler` with `set_epoch` every epoch, `DistributedDataParallel`, the
project's `SeqNet` or `ConvNet` (they are `nn.Module`s), Adam and the one-cycle schedule, evaluation on every process
with each sample counted once. Given the same settings it computes what `python train.py` computes, step for step:
`tests/test_plain_ddp.py` trains both on 2 processes and compares the weights. Each line that is there to match
train.py says what of train.py it matches. What train.py adds (logs, checkpoints, the dashboard, stops and
continuations, the checks of its settings) is not here; the benchmarks time one against the other
(benchmarks/README.md).

    python benchmarks/plain_ddp.py --data-dir ../shared/datasets --dataset mnist --processes 2
    torchrun --nproc-per-node 4 benchmarks/plain_ddp.py --data-dir DATA --dataset mnist   # one process per GPU
"""

import argparse
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datamodules.mnist import DATASETS  # noqa: E402 (torchvision's class, the pixels' mean and std, of each dataset)
from models import ConvNet, SeqNet  # noqa: E402


def load(data_dir: str, dataset: str, val_size: int) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """The training, held-out and test images, uint8 (N, 28, 28), and their labels: train.py's split
    (`--data.val_size` images held out of the training file, drawn with `--data.val_split_seed` 0)."""
    dataset_class = DATASETS[dataset][0]
    train, test = (dataset_class(data_dir, train=train) for train in (True, False))  # the IDX files, decoded
    order = torch.randperm(len(train.data), generator=torch.Generator().manual_seed(0))
    held_out, kept = order[:val_size], order[val_size:]
    return (
        TensorDataset(train.data[kept], train.targets[kept]),
        TensorDataset(train.data[held_out], train.targets[held_out]),
        TensorDataset(test.data, test.targets),
    )


def make_model(name: str, dataset: str) -> nn.Module:
    """The project's network; it normalises uint8 images itself, with the training set's mean and std."""
    _, mean, std = DATASETS[dataset]
    model = {"SeqNet": SeqNet, "ConvNet": ConvNet}[name](pixel_mean=mean, pixel_std=std)
    model.configure_model()  # its speed settings (channels_last), as Lightning has it apply them before training
    return model


def training_loader(
    train_set: TensorDataset, batch_size: int, seed: int, rank: int, world_size: int
) -> tuple[DistributedSampler, DataLoader]:
    """This process's share of each epoch: the sampler gives every process its strided part of one permutation
    (seeded, as Lightning seeds the samplers; `set_epoch` draws another each epoch). Each batch is one indexing of
    the tensors (a `BatchSampler` as the sampler, no collation of single images), as train.py's datamodule does."""
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    return sampler, DataLoader(train_set, sampler=BatchSampler(sampler, batch_size, drop_last=False), batch_size=None)


def train_step(model: nn.Module, optimizer, schedule, images: Tensor, labels: Tensor) -> Tensor:
    """One optimizer step, in Lightning's order: forward and loss, the gradients set to None, backward (where DDP
    all-reduces them), the update, the schedule's step."""
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    schedule.step()
    return loss


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset, device: torch.device, batch_size: int = 1000) -> float:
    """Every process evaluates every world_size-th sample, so each sample is counted once (a `DistributedSampler`
    would pad the set with repeats); the counts are summed over the processes. The model, not its DDP wrapper."""
    model.eval()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    images, labels = (tensor[rank::world_size] for tensor in data.tensors)
    counts = torch.zeros(2, device=device)  # right, seen
    for start in range(0, len(images), batch_size):
        logits = model(images[start : start + batch_size].to(device))
        counts[0] += (logits.argmax(dim=1) == labels[start : start + batch_size].to(device)).sum()
        counts[1] += len(logits)
    dist.all_reduce(counts)
    model.train()
    return (counts[0] / counts[1]).item()


def train(rank: int, world_size: int, args: argparse.Namespace) -> None:
    """One process of the job: global rank `rank` of `world_size`, on the GPU of its local rank or on the CPU."""
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local_rank) if args.accelerator == "gpu" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size)

    train_set, val_set, test_set = load(args.data_dir, args.dataset, args.val_size)
    torch.manual_seed(args.seed)  # train.py's --seed_everything, set before the model is built: the same weights
    model = make_model(args.model, args.dataset).to(device)
    device_ids = [local_rank] if device.type == "cuda" else None
    # One process has nothing to all-reduce: train.py runs it without the wrapper too (Lightning's choice)
    ddp_model = DistributedDataParallel(model, device_ids=device_ids) if world_size > 1 else model
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)  # train.py's default optimizer
    sampler, loader = training_loader(train_set, args.batch_size, args.seed, rank, world_size)
    # train.py's default schedule (models/base.py): one cycle over the run's steps, peaking at the optimizer's rate,
    # its momentum (Adam's first beta) cycled against it
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.epochs * len(loader))

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # another order each epoch, the same on every process
        for images, labels in loader:
            loss = train_step(ddp_model, optimizer, schedule, images.to(device), labels.to(device))
        val_acc = accuracy(model, val_set, device)
        if rank == 0:
            print(f"epoch {epoch}: train/loss {loss.item():.4f}  val/acc {val_acc:.4f}", flush=True)
    test_acc = accuracy(model, test_set, device)
    if rank == 0:
        print(f"Finished: test/acc {test_acc:.4f}  val/acc {val_acc:.4f}", flush=True)
        if args.save:
            torch.save(model.state_dict(), args.save)  # the module's, without DDP's `module.` prefix
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="data", help="the folder that holds MNIST/raw/ (train.py's default)")
    parser.add_argument("--dataset", default="fashion_mnist", choices=list(DATASETS))
    parser.add_argument("--model", default="SeqNet", choices=["SeqNet", "ConvNet"])
    parser.add_argument("--processes", type=int, help="processes on this machine (default: one per GPU, or 1)")
    parser.add_argument("--accelerator", choices=["cpu", "gpu"], help="default: gpu where there is one")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=0.01, help="the peak of the one-cycle schedule")
    parser.add_argument("--val-size", type=int, default=5000, help="images held out of the training file")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--save", help="where rank 0 writes the trained weights (a state dict)")
    args = parser.parse_args()
    args.accelerator = args.accelerator or ("gpu" if torch.cuda.is_available() else "cpu")
    if "RANK" in os.environ:  # started by torchrun, which set the address, port, rank and world size
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    processes = args.processes or (torch.cuda.device_count() if args.accelerator == "gpu" else 1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if processes > 1 and "OMP_NUM_THREADS" not in os.environ:  # the cores shared out, as Lightning's launcher does
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // processes))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    # This process is rank 0 and starts the others, as Lightning's launcher does (`mp.spawn` would start every rank
    # anew, and import torch once more); they end with it.
    others = mp.start_processes(other_rank, args=(processes, args), nprocs=processes - 1, join=False, daemon=True)
    train(0, processes, args)
    while not others.join():  # each process that ends; an error in one is raised here
        pass


def other_rank(index: int, world_size: int, args: argparse.Namespace) -> None:
    train(index + 1, world_size, args)


if __name__ == "__main__":
    main()
