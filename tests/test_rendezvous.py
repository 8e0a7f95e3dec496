"""RendezvousDDPStrategy: what a node says while it waits for another, Ctrl-C during the wait, and nodes started with
different settings; in processes the test starts itself, as Lightning's launcher starts a node's. Beside it, the
processes of Lightning's `ddp_spawn`: joined by Lightning, and stopped by a signal to the one that started them."""

import multiprocessing
import os
import re
import signal
import socket
import time
import types
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from app.console import UserError
from app.launch import wait_for_the_launched
from app.plugins import RendezvousDDPStrategy
from tests.helpers import ended, free_port, job, run_train, small_run, wait_for

pytestmark = pytest.mark.slow


def _meet(rank: int, nodes: int, settings: list[dict] | None, devices: int = 1) -> None:
    """One process of a job of `nodes` nodes of `devices` processes each, fitting Lightning's BoringModel;
    `settings`: each process's to agree on."""
    strategy = RendezvousDDPStrategy(agree_on=settings and settings[rank], notice_after_s=1)
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=nodes,
        strategy=strategy,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(BoringModel())
    except UserError as error:
        print(f"UserError {error.every_process}: {error}", flush=True)


def log(folder: Path, rank: int) -> str:
    path = folder / f"rank{rank}.log"
    return path.read_text() if path.exists() else ""


@pytest.mark.parametrize("present", [0, 1])
def test_a_node_waiting_for_a_missing_node_says_so_and_ctrl_c_ends_the_wait(tmp_path, present):
    (process,) = job(_meet, 2, 2, None, nodes=2, ranks=[present], folder=tmp_path)
    wait_for(lambda: "Ctrl-C ends the wait." in log(tmp_path, present), 60, "the node to say what it waits for")
    os.kill(process.pid, signal.SIGINT)
    assert ended([process], timeout=30) == [-signal.SIGINT]
    said = log(tmp_path, present)
    if present == 0:
        assert re.search(
            r"^Node 0 has waited \d+ s at 127\.0\.0\.1:\d+ for node\(s\) 1 of 2: not started yet", said, re.M
        )
    else:
        assert re.search(
            r"^Node 1 has waited \d+ s at 127\.0\.0\.1:\d+, where no process of node 0 answers yet", said, re.M
        )


def test_processes_still_starting_on_a_node_that_is_there_are_no_missing_node(tmp_path):
    """Of two nodes of two processes, node 0's second comes 3 s after the others (still importing, on a busy machine):
    nothing is said, where a missing node is said after 1 s."""
    port = free_port()
    first = job(_meet, 4, 2, None, 2, nodes=2, ranks=[0, 2, 3], port=port, folder=tmp_path)
    wait_for(lambda: all("Initializing distributed" in log(tmp_path, rank) for rank in (0, 2, 3)), 60, "the meeting")
    waited = time.monotonic() + 3
    wait_for(lambda: time.monotonic() > waited, 10, "3 s")
    second = job(_meet, 4, 2, None, 2, nodes=2, ranks=[1], port=port, folder=tmp_path)
    assert ended(first + second, timeout=60) == [0, 0, 0, 0], log(tmp_path, 0)[-2000:]
    assert not any("has waited" in log(tmp_path, rank) for rank in range(4))


def test_a_strategy_of_ones_own_raises_the_same_mistake_on_every_process_where_settings_differ(tmp_path):
    settings = [{"--model.optimizer.lr": 0.01, "--seed": 1}, {"--model.optimizer.lr": 0.02, "--seed": 1}]
    assert ended(job(_meet, 2, 2, settings, nodes=2, folder=tmp_path)) == [0, 0]
    for rank in (0, 1):
        assert (
            "UserError True: the nodes were started with different settings: --model.optimizer.lr is 0.01 on"
            " node 0 and 0.02 on node 1. Start every node with the same command line." in log(tmp_path, rank)
        )


def _train(rank: int, args: list[str], node_args: list[str]) -> None:
    from train import main  # noqa: PLC0415

    main([*args, *(node_args if rank == 1 else [])])


def test_nodes_started_with_other_options_end_in_one_line_naming_them_and_write_nothing(data_dir, tmp_path):
    args = small_run(data_dir, tmp_path, "--num_nodes", "2", devices=1)
    statuses = ended(job(_train, 2, args, ["--model.optimizer.lr", "0.02"], nodes=2, folder=tmp_path))
    said = log(tmp_path, 0) + log(tmp_path, 1)
    assert statuses == [1, 1], said[-3000:]
    assert [line for line in said.splitlines() if line.startswith("error")] == [
        "error: the nodes were started with different settings: --model.optimizer.lr is 0.01 on node 0 and 0.02 on"
        " node 1. Start every node with the same command line."
    ], said[-3000:]
    assert not (tmp_path / "SeqNet-mnist").exists()


def test_nodes_told_different_devices_end_at_once_in_one_line_naming_them(tmp_path):
    """Node 0 told one process a node, node 1 two: under Lightning's launcher they would wait for each other until the
    process group's timeout (half an hour); each node's first process says so and ends."""
    port = free_port()
    node_0 = job(_meet, 2, 2, None, 1, nodes=2, ranks=[0], port=port, folder=tmp_path)
    node_1 = job(_meet, 4, 2, None, 2, nodes=2, ranks=[2], port=port, folder=tmp_path)  # NODE_RANK 1, LOCAL_RANK 0
    assert ended(node_0 + node_1, timeout=60) == [1, 1]
    differ = "the nodes were started with different settings: --trainer.devices is 1 on node 0 and 2 on node 1."
    assert f"error: {differ}" in log(tmp_path, 0)
    assert re.search(rf"^error \(node 1 on [^)]+\): {re.escape(differ)}", log(tmp_path, 2), re.M)


def test_a_port_in_use_is_said_in_one_line(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert ended(job(_meet, 1, 1, None, port=port, folder=tmp_path), timeout=60) == [0]
    assert re.search(
        r"^UserError False: the processes of the job could not meet: .*address already in use\. Start every node with"
        r" the same MASTER_ADDR .* MASTER_PORT \(free on node 0\)",
        log(tmp_path, 0),
        re.M,
    ), log(tmp_path, 0)[-2000:]


def test_a_mistake_before_the_meeting_is_said_by_each_node(data_dir, tmp_path):
    """Each node's output is its own (another machine's terminal, another log): node 1 says the mistake too."""
    args = small_run(data_dir, tmp_path, "--num_nodes", "2", "--trainer.max_epoch", "3", devices=1)
    assert ended(job(_train, 2, args, [], nodes=2, folder=tmp_path)) == [1, 1]
    mistake = "--trainer.max_epoch: no such option; did you mean --trainer.max_epochs?"
    assert f"error: {mistake}" in log(tmp_path, 0).splitlines()
    assert re.search(rf"^error \(node 1 on [^)]+\): {re.escape(mistake)}$", log(tmp_path, 1), re.M), log(tmp_path, 1)


def test_the_processes_of_lightnings_ddp_spawn_are_lightnings_to_join():
    """`wait_for_the_launched` waits for the processes Lightning's subprocess launcher started (`Popen`); those of
    `--trainer.strategy ddp_spawn` (multiprocessing's) Lightning has joined, raising where one failed."""
    spawned = multiprocessing.get_context("spawn").Process(target=print)
    spawned.start()
    spawned.join()
    strategy = types.SimpleNamespace(launcher=types.SimpleNamespace(procs=[spawned]))
    assert wait_for_the_launched(strategy) == 0


def test_a_stop_signal_to_the_process_that_ddp_spawn_started_the_others_from_stops_them_all(data_dir, tmp_path):
    """That process trains nothing: it passes the signal on, waits for them to stop at one step, then stops as they
    did, saying how to continue; nothing runs on after it."""
    stop = ("--trainer.callbacks+=tests.instruments.SignalAt", "--trainer.callbacks.step=3", "--stop.every_n_steps=4")
    spawn = ("--trainer.strategy", "ddp_spawn", "--trainer.callbacks.parent=true")
    stopped = run_train(*small_run(data_dir, tmp_path, *stop, *spawn, devices=2))
    assert stopped.returncode == -signal.SIGTERM, stopped.stderr[-3000:]
    run = tmp_path / "SeqNet-mnist" / "version_0"
    said = f"Stopped by SIGTERM in epoch 0, after step 4; {run / 'checkpoints' / 'last.ckpt'} holds that step."
    assert said in stopped.stderr  # (ddp_spawn's processes say it as Lightning does)
    assert f"train.py --ckpt_path {run} --devices 2 --trainer.accelerator cpu" in stopped.stdout
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
