"""Who speaks for the job, in-process against a local TCPStore: of the processes that fail, the first says why, once.

The real runs (a bug on one rank or on every rank, a mistake found once the processes met) are in
tests/test_errors.py; these try the orders a real run meets only by chance.
"""

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from app.command_line.speaking import leave_the_store, speak_once
from tests.helpers import wait_for


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))


def client(store: dist.TCPStore) -> dist.Store:
    tcp = dist.TCPStore("127.0.0.1", store.port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=5))
    return dist.PrefixStore("report/0/", tcp)


def error_lines(capfd: pytest.CaptureFixture) -> list[str]:
    """What was printed as an error (torch's own warnings about the store, `[W...]`, aside)."""
    return [line for line in capfd.readouterr().err.splitlines() if line.startswith("error")]


def test_of_four_ranks_failing_at_once_one_line_is_printed(store, capfd):
    ranks = [
        threading.Thread(target=speak_once, args=(client(store), f"error (rank {rank}): planned failure"))
        for rank in range(4)
    ]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(timeout=30)
    lines = error_lines(capfd)
    assert len(lines) == 1 and lines[0].endswith(": planned failure"), lines


def test_the_others_wait_until_the_first_has_spoken(store, capfd):
    first = client(store)
    assert first.add("failed", 1) == 1  # the first to fail, about to print
    second = threading.Thread(target=speak_once, args=(client(store), "error (rank 1): lost its peer"))
    second.start()
    # the second has counted itself: it is not the first
    wait_for(lambda: first.add("failed", 0) == 2, 30, "the second to count itself", every=0.01)
    assert second.is_alive()  # waiting for the first to have spoken, silent
    first.set("spoken", "")  # what speak_once does once it has printed
    second.join(timeout=30)
    assert not second.is_alive() and error_lines(capfd) == []


def test_a_first_that_never_speaks_leaves_the_word_to_the_next(store, capfd):
    client(store).add("failed", 1)  # failed first, then was killed before it printed
    speak_once(client(store), "error (rank 1): planned failure", wait_s=0.5)
    assert error_lines(capfd) == ["error (rank 1): planned failure"]


def test_a_store_that_is_gone_leaves_each_to_speak(capfd):
    holder = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    gone = client(holder)
    del holder  # the process that held it (global rank 0) ended
    speak_once(gone, "error (rank 1): planned failure")
    assert error_lines(capfd) == ["error (rank 1): planned failure"]


def test_under_torchrun_a_process_that_reported_keeps_the_agents_store_up_until_the_others_have(store, monkeypatch):
    """torchrun's agent, which holds the store, ends once one of its processes has ended: one that ended at once would
    leave a process of another node, slower to start, to find the store gone and speak a second time."""
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    first = threading.Thread(target=leave_the_store, args=(client(store),))
    first.start()
    other = client(store)
    wait_for(lambda: other.check(["reported/0"]), 30, "global rank 0 to say it reported", every=0.01)
    assert first.is_alive()  # the other has not reported yet
    other.set("reported/1", "")
    first.join(timeout=5)  # at once, not at the end of its 20 s
    assert not first.is_alive()
