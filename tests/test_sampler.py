"""The training sampler in-process: a stopped epoch continues on any number of ranks, each remaining sample once.

The real runs (stopped on 2 processes, continued on 1 and on 4, to the weights of a run never stopped) are in
tests/test_faults.py.
"""

from collections import Counter

import pytest
from torch.utils.data import DistributedSampler

from datamodules.sampler import ResumableDistributedSampler

SAMPLES, SEED, EPOCH = range(101), 3, 2  # 101 divides by none of the numbers of ranks below


def samplers(ranks: int) -> list[ResumableDistributedSampler]:
    dealt = [ResumableDistributedSampler(SAMPLES, ranks, rank, seed=SEED) for rank in range(ranks)]
    for sampler in dealt:
        sampler.set_epoch(EPOCH)
    return dealt


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_from_the_start_it_deals_what_lightnings_distributed_sampler_deals(ranks):
    for rank, sampler in enumerate(samplers(ranks)):
        lightnings = DistributedSampler(SAMPLES, ranks, rank, shuffle=True, seed=SEED)
        lightnings.set_epoch(EPOCH)
        assert list(sampler) == list(lightnings)


@pytest.mark.parametrize(("before", "after"), [(2, 3), (4, 1), (3, 2), (2, 2)])
def test_a_stopped_epoch_continues_on_another_number_of_ranks_with_each_remaining_sample_once(before, after):
    stopped = samplers(before)
    running = [iter(sampler) for sampler in stopped]
    seen = [next(rank) for _step in range(7) for rank in running]  # 7 steps, a sample per rank each
    states = [sampler.state_dict() for sampler in stopped]
    assert states == [{"epoch": EPOCH, "position": 7 * before}] * before  # the same on every rank: saved by rank 0

    continued = [ResumableDistributedSampler(SAMPLES, after, rank, seed=SEED) for rank in range(after)]
    for sampler in continued:
        sampler.load_state_dict(states[0])
        sampler.set_epoch(EPOCH)  # what Lightning does for the continued epoch
    given = [list(sampler) for sampler in continued]
    rest = Counter(index for indices in given for index in indices)
    remaining = set(SAMPLES) - set(seen)
    assert all(rest[index] == 1 for index in remaining)  # each remaining sample once, none left out
    padding = (-len(remaining)) % after  # an even share per rank: the epoch's first samples again, as Lightning's
    assert sum(rest.values()) == len(remaining) + padding and set(rest) - remaining <= set(seen)
    assert [len(indices) for indices in given] == [(len(remaining) + padding) // after] * after  # no rank waits


def test_a_checkpoint_of_an_epochs_last_step_continues_with_the_next_epoch():
    """Workers draw their first batches before Lightning sets the next epoch: from the end of the old permutation,
    nothing, and the next epoch trained no batch."""
    (stopped,) = samplers(1)
    list(stopped)  # the whole epoch
    continued = ResumableDistributedSampler(SAMPLES, 1, 0, seed=SEED)
    continued.load_state_dict(stopped.state_dict())
    (next_epoch,) = samplers(1)
    next_epoch.set_epoch(EPOCH + 1)
    assert list(continued) == list(next_epoch)  # before any `set_epoch`, as with workers
