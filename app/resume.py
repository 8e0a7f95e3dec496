"""Continuing a run where it stopped: `--ckpt_path last`.

Every run logs into a new `<root>/<Model>-<dataset>/version_N` folder, so Lightning's own `ckpt_path="last"`,
which looks in the new run's folder, would never find anything. Here "last" means the latest run of the same
model and dataset under `--trainer.default_root_dir`: its folder is reused, so the resumed run continues the same
TensorBoard curves, and training starts from its newest checkpoint. With nothing to resume, `fit` starts afresh, so
a job restarted by its launcher (torchrun `--max-restarts`, a SLURM requeue) can carry `--ckpt_path last` from
its first start. Every process finds the same folder and checkpoint on its own: no rank depends on another.
"""

from collections.abc import Iterable
from pathlib import Path

from lightning.pytorch import Trainer
from lightning.pytorch.plugins.environments import SLURMEnvironment

from app.checkpoint_io import remove_partial_files


def latest_version(run_folder: Path) -> int | None:
    """The highest N of the `version_N` folders in `run_folder`, or None when there is none."""
    versions = [int(path.name[8:]) for path in run_folder.glob("version_*") if path.name[8:].isdigit()]
    return max(versions, default=None)


def newest_checkpoint(checkpoint_folders: Iterable[Path], root: Path) -> Path | None:
    """The checkpoint a resumed run should start from: the newest `last*.ckpt` of the run's checkpoint folders.

    On SLURM, the checkpoint that Lightning's SLURM plugin writes when the job is pre-empted (`hpc_ckpt_N.ckpt` in
    `--trainer.default_root_dir`) competes too: it is the newest when the job was requeued by the signal, an older
    `last.ckpt` when a later failure requeued it again.
    """
    candidates = [path for folder in checkpoint_folders for path in folder.glob("last*.ckpt")]
    if SLURMEnvironment.detect():
        candidates += root.glob("hpc_ckpt_*.ckpt")
    return max(candidates, key=lambda path: path.stat().st_mtime, default=None)


def resume_from_newest_checkpoint(trainer: Trainer, root: Path, subcommand: str) -> str | None:
    """The checkpoint `--ckpt_path last` stands for, as a path, or None to start afresh (`fit` only)."""
    run_folder = Path(trainer.log_dir) if trainer.loggers else root
    folders = {Path(c.dirpath or run_folder / "checkpoints") for c in trainer.checkpoint_callbacks}
    if trainer.global_rank == 0:
        for folder in folders:
            remove_partial_files(folder)
    checkpoint = newest_checkpoint(folders, root)
    if checkpoint is None and subcommand != "fit":
        raise FileNotFoundError(
            f"--ckpt_path last: no last checkpoint in {run_folder}. Train first, or give --ckpt_path FILE."
        )
    if trainer.global_rank == 0:
        found = f"resuming from {checkpoint}" if checkpoint else f"nothing to resume in {root}, starting afresh"
        print(f"--ckpt_path last: {found}")
    return str(checkpoint) if checkpoint else None
