"""Train and test an image classifier with PyTorch Lightning and DDP. `python train.py --help` says how."""

from app.launch import die_with_parent

die_with_parent()  # before the slow imports below, while the launcher that started this process surely lives

from app.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
