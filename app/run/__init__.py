"""A run: its folder, checkpoints, logs, dashboard, predictions and exports, and how it continues."""
