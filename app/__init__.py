"""What train.py runs (`main.py`), in three rooms:

- `command_line/`: what the user typed and what the program says back (the LightningCLI, its checks and messages);
- `job/`: what the project adds to the processes of a DDP job: their ends, their meeting, their heartbeats, their
  stops and faults;
- `run/`: a run: its folder, checkpoints, logs and dashboard, predictions and exports, and how it continues.
"""
