import os
from pathlib import Path

import pytest

from tests.helpers import run_train, scalars
from tests.synthetic import write_dataset

TRAIN_SIZE, TEST_SIZE = 1200, 301  # 301 divides by neither 2 nor 3 ranks


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder with small synthetic MNIST and FashionMNIST in torchvision's layout."""
    root = tmp_path_factory.mktemp("data")
    write_dataset(root, "MNIST", TRAIN_SIZE, TEST_SIZE, seed=0)
    write_dataset(root, "FashionMNIST", TRAIN_SIZE, TEST_SIZE, seed=1)
    return root


@pytest.fixture(autouse=True)
def restore_environment():
    """Put the environment variables back after each test.

    A test that runs train.py inside this process lets Lightning set MASTER_PORT, NODE_RANK, LOCAL_RANK, ... here.
    A train.py started later by another test would inherit them, and with LOCAL_RANK set Lightning takes the
    processes to be started by someone else and waits for ranks that never come.
    """
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def checkpoint(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """A SeqNet trained for one epoch on the synthetic MNIST, and its test accuracy as the run logged it."""
    root = tmp_path_factory.mktemp("runs")
    common = ("--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false")
    argv = ("--data.dataset", "mnist", "--data.data_dir", str(data_dir), "--data.val_size", "200")
    result = run_train(*common, *argv, "--trainer.max_epochs", "1", "--trainer.default_root_dir", str(root))
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (root / "SeqNet-mnist").iterdir()
    best = next(path for path in (run / "checkpoints").iterdir() if path.name != "last.ckpt")
    return best, scalars(run)["test/acc"][0]
