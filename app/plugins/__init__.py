"""The plugins of app/: a strategy and a checkpoint writer, for any Lightning `Trainer`."""

from app.plugins.checkpoint_io import AtomicCheckpointIO
from app.plugins.rendezvous import RendezvousDDPStrategy

__all__ = ["AtomicCheckpointIO", "RendezvousDDPStrategy"]
