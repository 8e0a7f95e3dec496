"""What the user typed and what the program says back: the command line (`argv.py`, then `train_cli.py` with
LightningCLI), the checks before the launch, one line per mistake, and who speaks."""
