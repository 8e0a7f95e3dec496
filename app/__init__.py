"""What train.py runs (`main.py`), in three rooms: `command_line/`, `job/` and `run/` (docs/architecture.md)."""
