"""The training sampler: Lightning's `DistributedSampler`, plus the position in the epoch, so that a stopped epoch
continues from the next sample, on any number of processes."""

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, DistributedSampler


class ResumableDistributedSampler(DistributedSampler):
    """Each rank's strided share of the epoch's permutation, as `DistributedSampler` deals it, resumable mid-epoch.

    A `DistributedSampler` gives rank r of N the positions r, r + N, r + 2N, ... of one seeded permutation of the
    epoch, so the ranks' k-th batches together are the permutation's k-th block of (batch x N) samples. Its state
    here is how far into the permutation all ranks together have got (`position`, saved by torchdata's
    `StatefulDataLoader` in every checkpoint); a continued epoch deals the rest of the permutation out to however
    many ranks there are now, each sample once. With the global batch kept (`MNISTDataModule.batch_size_to_continue`),
    every optimizer step after the resume sees the samples it would have seen without the stop.

    Why not torchdata's `StatefulDistributedSampler`: its state counts the samples one rank has given, which means
    nothing to a run continued on another number of processes. From position 0 this sampler gives exactly what
    `DistributedSampler(shuffle=True, drop_last=False)` gives, padding included.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.resume_at: dict[str, int] | None = None  # the position to start the next pass from, after a resume
        self.start = 0  # position of the current pass's first sample
        self.given = 0  # samples this rank has given in the current pass

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        order = order.tolist()
        resume, self.resume_at = self.resume_at, None
        self.start = resume["position"] if resume and resume["epoch"] == self.epoch else 0
        self.given = 0
        rest = order[self.start :]
        padding = (-len(rest)) % self.num_replicas  # every rank takes as many samples: repeat the epoch's first ones
        rest += (order * math.ceil(padding / len(order)))[:padding]
        for index in rest[self.rank :: self.num_replicas]:
            self.given += 1
            yield index

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.start + self.given * self.num_replicas}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The epoch too: with DataLoader workers, the loader asks for its first batches as soon as Lightning makes
        the iterator on resume, before Lightning's `set_epoch` for the continued epoch. A position at the end of
        the permutation is the next epoch's start (a checkpoint of the epoch's last step: workers drew nothing)."""
        if state_dict["position"] >= len(self.dataset):
            state_dict = {"epoch": state_dict["epoch"] + 1, "position": 0}
        self.epoch = state_dict["epoch"]
        self.resume_at = state_dict
