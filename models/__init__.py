"""The networks `--model` names: `ImageClassifier` and its subclasses, one module each.

Every module of this folder is imported here, so that a new subclass in a new file (`models/tinynet.py` holding
`class TinyNet(ImageClassifier)`) is `--model TinyNet` with nothing else to edit: LightningCLI finds a model class
among the imported subclasses of `ImageClassifier`.
"""

import importlib
import pkgutil

from models.base import ImageClassifier
from models.convnet import ConvNet
from models.seqnet import SeqNet

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def model_names() -> list[str]:
    """The names `--model` takes, as a user types them."""
    found, todo = [], list(ImageClassifier.__subclasses__())
    while todo:
        cls = todo.pop(0)
        found.append(cls.__name__)
        todo += cls.__subclasses__()
    return sorted(set(found), key=found.index)


__all__ = ["ConvNet", "ImageClassifier", "SeqNet", "model_names"]
