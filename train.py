"""Train and test an image classifier with PyTorch Lightning and DDP. `python train.py --help` says how."""

import gc


def main() -> None:
    """Import the program, then run it (`app/main.py`).

    Importing torch, Lightning, torchvision and torchmetrics creates about a million objects that live as long as the
    program. With the garbage collector on, Python scans them over and over while importing (a second of start-up on
    2 cores, in every process) and once more at exit: off while importing, then frozen, they are never scanned.
    Ctrl-C while importing ends the process as the signal does, without a traceback of the import under way (unless
    Ctrl-C is ignored, as in a job a shell started in the background). First of all, a process that Lightning's
    launcher or torchrun started dies with its parent (`app/job/children.py`), and the filter of what Python's
    shutdown prints comes last (`app/command_line/quiet.py`).
    """
    from app.command_line.quiet import silence_the_shutdown  # noqa: PLC0415 (the standard library only)
    from app.job.children import ctrl_c_ends_at_once, die_with_parent  # noqa: PLC0415 (the standard library only)

    die_with_parent()
    silence_the_shutdown()
    gc.disable()
    with ctrl_c_ends_at_once():
        from app.main import main as run  # noqa: PLC0415 (the imports the collector must not scan)
    gc.freeze()
    gc.enable()
    run()


if __name__ == "__main__":
    main()
