"""The one name of Lightning's own that the program touches (docs/architecture.md, "Names of the libraries' own"):
pinned by its behaviour, and no other."""

import ast
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from app.callbacks.graceful_stop import GracefulStop
from app.plugins.rendezvous import RendezvousDDPStrategy
from tests.helpers import REPO, ended, job

# Names beginning with `_` that the project's code reads, sets or overrides on objects of Lightning, torch or
# jsonargparse, and where: one, allowed three.
KNOWN = {"_broadcast_sigterm_tensor": "app/callbacks/graceful_stop.py"}
OWN = {"os._exit"}  # the standard library's public way to end a process at once


def library_names(module: str, class_name: str) -> set[str]:
    """The `_names` the library classes that the class `class_name` of `module` extends define or set."""
    names = set()
    for base in getattr(importlib.import_module(module), class_name).__mro__[1:]:
        if base.__module__.split(".")[0] in ("lightning", "torch", "jsonargparse"):
            names |= set(re.findall(r"(?:self\.|def )(_[a-z]\w*)", inspect.getsource(base)))
    return names


def test_no_other_private_name_of_a_library_is_touched():
    found = {}
    for path in [REPO / "train.py", *(p for f in ("app", "models", "datamodules") for p in (REPO / f).rglob("*.py"))]:
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for cls in (node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)):
            own = {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "self"}
            own |= {n.name for n in ast.walk(cls) if isinstance(n, ast.FunctionDef)}
            for name in own & library_names(module, cls.name):  # one of its library base's own, by this class
                found[name] = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = ast.unparse(node.value)
                if owner not in ("self", "cls") and f"{owner}.{node.attr}" not in OWN:
                    found[node.attr] = str(path.relative_to(REPO))
            named = isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "setattr",
                "getattr",
                "delattr",
                "hasattr",
            )
            if named and len(node.args) > 1 and str(getattr(node.args[1], "value", "")).startswith("_"):
                found[node.args[1].value] = str(path.relative_to(REPO))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("lightning", "torch"):
                found |= {alias.name: str(path.relative_to(REPO)) for alias in node.names if alias.name.startswith("_")}
    assert found == KNOWN


class Counted(Callback):
    """Counts the calls of what stands in the epoch loop's SIGTERM broadcast (GracefulStop's) once training starts."""

    def on_train_start(self, trainer, pl_module) -> None:
        loop, self.calls = trainer.fit_loop.epoch_loop, 0
        stand_in = vars(loop)["_broadcast_sigterm_tensor"]  # GracefulStop's, put on the instance

        def counted() -> None:
            self.calls += 1
            stand_in()

        loop._broadcast_sigterm_tensor = counted

    def on_train_end(self, trainer, pl_module) -> None:
        Path(trainer.default_root_dir, f"calls{trainer.global_rank}.json").write_text(json.dumps(self.calls))


def _fit(rank: int, folder: Path) -> None:
    trainer = Trainer(accelerator="cpu", devices=2, strategy=RendezvousDDPStrategy(), max_steps=6, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[GracefulStop(), Counted()], default_root_dir=folder)  # fmt: skip
    trainer.fit(BoringModel())
    assert "_broadcast_sigterm_tensor" not in vars(trainer.fit_loop.epoch_loop)  # the loop's own again


@pytest.mark.slow
def test_lightnings_epoch_loop_calls_the_sigterm_broadcast_put_on_its_instance_before_every_step(tmp_path):
    """What GracefulStop relies on: the loop looks the method up on its instance at every step of a DDP job."""
    assert ended(job(_fit, 2, tmp_path, folder=tmp_path)) == [0, 0]
    assert [json.loads((tmp_path / f"calls{rank}.json").read_text()) for rank in (0, 1)] == [6, 6]
