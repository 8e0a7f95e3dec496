"""Plugins of the Trainer: a strategy and a checkpoint writer, each usable in any Trainer."""
