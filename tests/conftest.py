import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.helpers import run_in_process, scalars, state_kept
from tests.synthetic import write_dataset

# One thread per process: the suite runs three workers on CI's 2 cores, each starting jobs of 1 to 4 processes, and
# torch's default of a thread per core has the threads of every process spin against each other. Results do not
# depend on it; every process a test starts inherits it.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)
# Started in the background of a shell without job control (`make test &`, nohup), the tests inherit Ctrl-C ignored,
# and so would every process they start: the tests of Ctrl-C send it as a terminal does, to processes that hear it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TRAIN_SIZE, TEST_SIZE = 1200, 301  # 301 divides by neither 2 nor 3 processes


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder with small synthetic MNIST and FashionMNIST in torchvision's layout."""
    root = tmp_path_factory.mktemp("data")
    write_dataset(root, "MNIST", TRAIN_SIZE, TEST_SIZE, seed=0)
    write_dataset(root, "FashionMNIST", TRAIN_SIZE, TEST_SIZE, seed=1)
    return root


# The longest files first: pytest-xdist hands out whole files in the order of collection, and a long file handed out
# last keeps one worker busy after the others are done.
LONGEST_FIRST = [
    "test_slurm",  # where SLURM is (a minute for one test); skipped elsewhere
    "test_multinode",
    "test_program",
    "test_elastic",
    "test_continuation",
    "test_graceful_stop",
    "test_stall_watchdog",
    "test_plain_ddp",
    "test_pieces",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def place(item: pytest.Item) -> int:
        name = item.module.__name__.rsplit(".", 1)[-1]
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=place)


@pytest.fixture(scope="session", autouse=True)
def temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder of the processes the tests start inside pytest's own (torchrun leaves one per job)."""
    folder = tmp_path_factory.mktemp("tmp")
    os.environ["TMPDIR"] = str(folder)
    return folder


@pytest.fixture(autouse=True)
def kept():
    """A run in this process sets signal handlers and variables (MASTER_PORT, ...) that a later one would inherit."""
    with state_kept():
        yield


@pytest.fixture(scope="session")
def checkpoint(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """A SeqNet trained for one epoch on the synthetic MNIST, and its test accuracy as the run logged it."""
    root = tmp_path_factory.mktemp("runs")
    argv = ("--data.dataset", "mnist", "--data.data_dir", str(data_dir), "--data.val_size", "200")
    result = run_in_process(
        *argv,
        "--trainer.accelerator",
        "cpu",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.max_epochs",
        "1",
        "--trainer.default_root_dir",
        str(root),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (root / "SeqNet-mnist").iterdir()
    best = next(path for path in (run / "checkpoints").iterdir() if path.name != "last.ckpt")
    return best, scalars(run)["test/acc"][0]


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: hosts 10.99.0.1 and 10.99.0.2, each with its own loopback.

    Needs root and iproute2; the test is skipped, saying why, where they are missing.
    """
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2 (ip)")
    names = [f"lddp{os.getpid()}{side}" for side in "ab"]
    setup = [
        *(["ip", "netns", "add", name] for name in names),
        ["ip", "link", "add", f"{names[0]}v", "type", "veth", "peer", "name", f"{names[1]}v"],
        *(["ip", "link", "set", f"{name}v", "netns", name] for name in names),
        *(["ip", "-n", name, "addr", "add", f"10.99.0.{i + 1}/24", "dev", f"{name}v"] for i, name in enumerate(names)),
        *(["ip", "-n", name, "link", "set", device, "up"] for name in names for device in ("lo", f"{name}v")),
    ]
    try:
        for command in setup:
            made = subprocess.run(command, capture_output=True, text=True)
            if made.returncode != 0:
                pytest.skip(f"cannot make network namespaces here: {' '.join(command)}: {made.stderr.strip()}")
        yield names
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
