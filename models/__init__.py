from models.base import ImageClassifier
from models.convnet import ConvNet
from models.seqnet import SeqNet

__all__ = ["ConvNet", "ImageClassifier", "SeqNet"]
