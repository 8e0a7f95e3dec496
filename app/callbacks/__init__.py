"""The callbacks of app/: each one behaviour no library has, for any Lightning `Trainer`."""

from app.callbacks.dashboard import Dashboard
from app.callbacks.graceful_stop import GracefulStop, Stopped
from app.callbacks.predictions import PredictionWriter
from app.callbacks.stall_watchdog import StallWatchdog

__all__ = ["Dashboard", "GracefulStop", "PredictionWriter", "StallWatchdog", "Stopped"]
