from pathlib import Path

import pytest

from tests.synthetic import write_dataset

TRAIN_SIZE, TEST_SIZE = 1200, 301  # 301 divides by neither 2 nor 3 ranks


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder with small synthetic MNIST and FashionMNIST in torchvision's layout."""
    root = tmp_path_factory.mktemp("data")
    write_dataset(root, "MNIST", TRAIN_SIZE, TEST_SIZE, seed=0)
    write_dataset(root, "FashionMNIST", TRAIN_SIZE, TEST_SIZE, seed=1)
    return root
