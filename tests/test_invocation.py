"""The commands the program prints run where the user stands (app/invocation.py): the environment's
`tensorboard` and `python train.py` by their paths unless the PATH already leads to them."""

import os
import sys
from pathlib import Path

from app.invocation import tool, train_py

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def without_this_environment(monkeypatch) -> None:
    path = [part for part in os.environ["PATH"].split(os.pathsep) if Path(part).resolve() != BIN.resolve()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))


def test_an_environment_not_activated_is_named_by_its_paths(monkeypatch):
    without_this_environment(monkeypatch)
    monkeypatch.chdir(REPO)
    python = os.path.relpath(sys.executable, REPO) if Path(sys.executable).is_relative_to(REPO) else sys.executable
    assert train_py() == f"{python} train.py"
    tensorboard = BIN / "tensorboard"
    assert tool("tensorboard") == (
        os.path.relpath(tensorboard, REPO) if tensorboard.is_relative_to(REPO) else str(tensorboard)
    )


def test_an_activated_environment_is_named_by_its_names(monkeypatch):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(REPO)
    assert train_py() == f"{Path(sys.executable).name} train.py"
    assert tool("tensorboard") == "tensorboard"


def test_train_py_is_named_from_another_folder_by_its_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    assert train_py() == f"{Path(sys.executable).name} {REPO / 'train.py'}"
