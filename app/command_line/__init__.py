"""What the user typed and what the program says back: the command line (`argv.py` before the imports,
`train_cli.py` with LightningCLI), the checks before the processes meet, one line per mistake, and who speaks."""
