"""Train and test an image classifier with PyTorch Lightning and DDP. `python train.py --help` says how."""

from app.cli import main

if __name__ == "__main__":
    main()
