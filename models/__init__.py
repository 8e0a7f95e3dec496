"""The networks `--model` names: `ImageClassifier` and its subclasses, one module each.

Every module of this folder is imported here, so that a new subclass in a new file (`models/tinynet.py` holding
`class TinyNet(ImageClassifier)`) is `--model TinyNet` with nothing else to edit: LightningCLI finds a model class
among the imported subclasses of `ImageClassifier`.
"""

import importlib
import os
import pkgutil
import sys

from models.base import ImageClassifier
from models.convnet import ConvNet
from models.seqnet import SeqNet


def _import_every_module() -> None:
    """Import each module of this folder; one that does not import is said in a line, by one process of the job,
    and the others still serve."""
    for module in pkgutil.iter_modules(__path__):
        try:
            importlib.import_module(f"{__name__}.{module.name}")
        except Exception as error:  # noqa: BLE001 (a user's file with a mistake must not stop the other models)
            if os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) == "0":
                print(
                    f"models/{module.name}.py could not be imported ({type(error).__name__}: {error}): the models it"
                    " holds cannot be named with --model until it imports.",
                    file=sys.stderr,
                )


_import_every_module()


def model_names() -> list[str]:
    """The names `--model` takes, as a user types them."""
    found, todo = [], list(ImageClassifier.__subclasses__())
    while todo:
        cls = todo.pop(0)
        found.append(cls.__name__)
        todo += cls.__subclasses__()
    return list(dict.fromkeys(found))  # once each, in the order found


__all__ = ["ConvNet", "ImageClassifier", "SeqNet", "model_names"]
