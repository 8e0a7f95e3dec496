from datamodules.mnist import DataError, MNISTDataModule

__all__ = ["DataError", "MNISTDataModule"]
