"""Who stopped answering, in-process: the heartbeats of two "ranks" against a local TCPStore.

The real runs (a frozen rank under both launch paths, a frozen store holder) are in tests/test_stalls.py; these try
the cases a real run reaches only by chance: a rank that failed and said so, a store call that timed out, a host
whose /proc says nothing.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from lightning.pytorch import Trainer
from tqdm import tqdm

from app.command_line.speaking import report
from app.job import heartbeats
from app.job.fault_guard import FaultGuard
from app.job.heartbeats import Heartbeats
from tests.helpers import wait_for

LIMIT_S = 1.0  # seconds of silence before a rank is named; the threads look every 0.5 s


@pytest.fixture
def store():
    """The job's store, held by this process (global rank 0's role under Lightning's launcher)."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))


def client(store: dist.TCPStore, prefix: str = "stage/") -> dist.Store:
    """What FaultGuard gives each rank: a client of its own, under the stage's prefix."""
    tcp = dist.TCPStore("127.0.0.1", store.port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=5))
    return dist.PrefixStore(prefix, tcp)


class Watcher:
    """Rank 0's heartbeats, with the end of the job recorded instead of done."""

    def __init__(self, store: dist.Store, rank: int = 0, where=list, waiting: bool = False) -> None:
        self.ended = threading.Event()
        self.beats = Heartbeats(
            rank, 2, LIMIT_S, store, lambda: "nothing kept", where, end_job=self._end, waiting=lambda: waiting
        )

    def _end(self, status: int) -> None:
        self.status = status
        self.ended.set()


def a_rank_that_beat_once(store: dist.Store, rank: int, pid: int, pid_space: str | None, host="this-host") -> None:
    """A rank that said who it is and beat once, then never again: frozen."""
    store.set(f"who/{rank}", json.dumps({"host": host, "pid": pid, "pid_space": pid_space}))
    store.add(f"beat/{rank}", 1)


@pytest.fixture
def bystander():
    """A process that has nothing to do with the job; it must never be killed by mistake."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    yield process
    process.kill()
    process.wait()


def test_a_rank_that_stopped_beating_is_named_and_killed_and_the_job_ends(store, capsys, bystander):
    watcher = Watcher(client(store))
    a_rank_that_beat_once(client(store), 1, bystander.pid, heartbeats._pid_space())
    watcher.beats.start()
    assert watcher.ended.wait(LIMIT_S * 20), "rank 1 was never named"
    assert watcher.status == 1
    said = capsys.readouterr()
    assert f"Global rank 1 (pid {bystander.pid} on this-host) has given no sign of life for" in said.out
    assert "error: a process of the job stopped answering, so the job ends; nothing kept\n" in said.err
    assert bystander.wait(timeout=30) == -signal.SIGKILL  # a frozen process of this host would stay forever


def test_a_rank_named_while_a_progress_bar_is_drawn_is_named_on_a_line_of_its_own(store, capsys):
    """The heartbeat thread speaks while the main thread draws Lightning's progress bar: printed after the bar, its
    line stood on the bar's line; tqdm takes the bar away for it, then draws it again."""
    bar = tqdm(total=100, file=sys.stdout, desc="Epoch 0")
    bar.update(3)
    watcher = Watcher(client(store))
    a_rank_that_beat_once(client(store), 1, 4242, None)  # a pid of no known pid namespace: never killed
    watcher.beats.start()
    try:
        assert watcher.ended.wait(LIMIT_S * 20), "rank 1 was never named"
    finally:
        bar.close()
    out = capsys.readouterr().out
    assert re.search(r"[\r\n]Global rank 1 \(pid 4242 on this-host\) has given no sign of life", out), repr(out[-600:])


def test_a_process_whose_pid_space_is_unknown_is_not_killed(store, bystander, monkeypatch):
    monkeypatch.setattr(heartbeats, "_pid_space", lambda: None)  # no /proc: where that pid lives is not known
    watcher = Watcher(client(store))
    a_rank_that_beat_once(client(store), 1, bystander.pid, None)
    watcher.beats.start()
    assert watcher.ended.wait(LIMIT_S * 20), "rank 1 was never named"
    assert bystander.poll() is None, "a process of that pid was killed"


def test_a_rank_whose_stage_failed_is_not_named_frozen_by_the_others(store, capsys):
    watcher = Watcher(client(store))
    guard = FaultGuard(stall_timeout=1)
    guard.heartbeats = Heartbeats(1, 2, LIMIT_S, client(store), on_stall=lambda: "", end_job=lambda status: None)
    guard.heartbeats.start()
    watcher.beats.start()
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    guard.on_exception(trainer, None, RuntimeError("rank 1's stage failed; it says so itself"))  # Lightning calls it
    assert guard.heartbeats is None
    # Rank 1's count stops moving; a bug names it after LIMIT_S. Watch three times as long.
    assert not watcher.ended.wait(LIMIT_S * 3), capsys.readouterr().out
    watcher.beats.stop()


class TimesOut:
    """A store whose holder stopped answering: each call ends with the error a TCPStore raises at its timeout."""

    def __init__(self, store: dist.Store) -> None:
        self.store, self.frozen = store, False
        probe = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=0.1))
        with pytest.raises(dist.DistStoreError) as timed_out:
            probe.get("a key nobody sets")
        self.error = timed_out.value

    def __getattr__(self, name: str):
        if self.frozen:
            raise self.error
        return getattr(self.store, name)


def test_a_store_call_that_times_out_names_the_store_holder(store, capsys):
    timing_out = TimesOut(client(store))
    watcher = Watcher(timing_out, rank=1)
    a_rank_that_beat_once(client(store), 0, os.getpid(), None)
    watcher.beats.start()
    timing_out.frozen = True
    assert watcher.ended.wait(LIMIT_S * 20), "the store's holder was never named"
    assert "holds the job's store, which has not answered for" in capsys.readouterr().out


def test_a_store_that_is_gone_ends_the_watching_without_a_word(capsys):
    holder = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    watcher = Watcher(client(holder))
    watcher.beats.start()
    del holder  # the store's process ended: so does the job, without these threads
    assert watcher.beats.stopped.wait(LIMIT_S * 20), "still watching a store that is gone"
    assert not watcher.ended.is_set() and capsys.readouterr().out == ""


def test_under_torchrun_a_silent_store_names_the_ranks_of_its_host_and_never_this_one(store, capsys, monkeypatch):
    """Two "nodes" on one machine: the agent of node 0 holds the store, and both ranks share its host."""
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    killed = []
    monkeypatch.setattr(heartbeats.os, "kill", lambda pid, signum: killed.append(pid))
    timing_out = TimesOut(client(store))
    watcher = Watcher(timing_out, rank=1)
    a_rank_that_beat_once(client(store), 0, 12345, heartbeats._pid_space(), host=socket.gethostname())  # one machine
    watcher.beats.start()
    # rank 1 reads who rank 0 is while the store still answers
    wait_for(lambda: len(watcher.beats.who) == 2, LIMIT_S * 20, "rank 1 to read who rank 0 is", every=0.05)
    timing_out.frozen = True
    assert watcher.ended.wait(LIMIT_S * 20), "the store's holder was never named"
    (named,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Global rank")]
    assert named.startswith("Global rank 0 (pid 12345 on ") and " 1 (pid" not in named, named  # not this one
    assert killed == [12345]  # rank 0, never this process


def two_ranks_standing(store: dist.TCPStore, *places: tuple[list, bool]) -> list[Watcher]:
    """Ranks 0 and 1 started, each standing still at its place (stage, epoch, step...), waiting in a collective or
    not."""
    ranks = [
        Watcher(client(store), rank, lambda p=place: p, waiting=waits) for rank, (place, waits) in enumerate(places)
    ]
    for watcher in ranks:
        watcher.beats.start()
    return ranks


def test_processes_that_all_wait_in_collectives_in_different_places_are_named_by_one_and_all_end(store, capsys):
    """Rank 0 went on to the test while rank 1 still trains its second epoch: both beat, both wait, neither moves."""
    ranks = two_ranks_standing(store, (["test", "test", 1, 10, 25], True), (["fit", "train", 1, 11, 11], True))
    assert all(watcher.ended.wait(LIMIT_S * 20) for watcher in ranks), "the deadlock was never named"
    said = capsys.readouterr()
    (line,) = [line for line in said.out.splitlines() if line.startswith("The processes")]  # said once
    assert line.startswith("The processes of the job wait for each other in different places, none moved for ")
    assert line.endswith(
        f"global rank 0 (pid {os.getpid()} on {socket.gethostname()}) is in test, epoch 1, step 10; global rank 1"
        f" (pid {os.getpid()} on {socket.gethostname()}) is in fit (train), epoch 1, step 11."
    )
    assert said.err.count("error: the processes of the job no longer meet in the same collective (a deadlock)") == 1


def test_processes_waiting_for_one_that_is_busy_elsewhere_are_left_alone(store, capsys):
    """Rank 0 still finishes the fit (a slow disk, a long validation) while rank 1 waits in the test's barrier."""
    ranks = two_ranks_standing(store, (["fit", "validate", 0, 10, 14], False), (["test", "test", 1, 10, 12], True))
    assert not any(watcher.ended.wait(LIMIT_S * 3) for watcher in ranks), capsys.readouterr().out
    for watcher in ranks:
        watcher.beats.stop()


def test_the_main_thread_is_seen_waiting_for_the_others_and_not_elsewhere():
    assert not heartbeats.main_thread_waits_in_a_collective()  # this test, running Python
    started, seen = threading.Event(), []

    def look() -> None:
        started.wait()
        time.sleep(1)  # the main thread now waits in torch.distributed for a rank 1 that never comes
        seen.append(heartbeats.main_thread_waits_in_a_collective())

    looker = threading.Thread(target=look)
    looker.start()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=3))
    started.set()
    with pytest.raises(dist.DistStoreError):
        dist.init_process_group("gloo", store=store, rank=0, world_size=2, timeout=timedelta(seconds=3))
    looker.join()
    assert seen == [True]


def test_an_error_in_the_heartbeat_thread_is_said_with_its_cause_and_never_gets_the_process_named_frozen(store, capsys):
    calls = []

    def fails_after_the_start() -> list:
        calls.append(1)
        if len(calls) > 1:
            raise KeyError("a bug in the heartbeat thread")
        return []

    watcher, failing = Watcher(client(store)), Watcher(client(store), 1, fails_after_the_start)
    watcher.beats.start()
    failing.beats.start()
    assert failing.beats.stopped.wait(LIMIT_S * 20), "the failing thread went on"
    assert not watcher.ended.wait(LIMIT_S * 3), capsys.readouterr().out  # rank 1 was not named frozen
    said = capsys.readouterr().err
    assert (
        "error in the heartbeat thread of global rank 1" in said and "KeyError: 'a bug in the heartbeat thread'" in said
    )
    assert not failing.ended.is_set()  # the process itself goes on
    watcher.beats.stop()


def test_a_process_that_stops_watching_after_the_stores_holder_died_says_nothing_more(capfd, monkeypatch):
    """Node 0 killed: the others' stage fails, each stops its heartbeats and reports. Both reached the store that
    had gone with node 0, and torch printed some 45 lines of C++ frames (a client's call to a closed store, then a
    new client's retries) before the one line that says what happened (app/command_line/speaking.py)."""
    holder = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    # A limit of 100 s: the thread's next beat is 10 s away, no call of its own meets the store that has gone
    beats = Heartbeats(1, 2, 100, client(holder), on_stall=lambda: "", end_job=lambda status: None)
    beats.start()
    port = holder.port
    del holder  # the store closes with its process
    beats.stop()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")  # the agent's store is the job's before the meeting
    report("error: the one line")
    said = capfd.readouterr()
    assert said.err == "error: the one line\n" and said.out == ""
