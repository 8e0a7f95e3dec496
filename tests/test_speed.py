"""The training loop reads no tensor back to the host between logging steps: on a GPU each such read (`.item()`,
`bool(tensor)`, `.cpu()`, ...) would wait for the device to finish, once per step."""

import traceback
from collections import Counter

import torch

from app.cli import main

HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__")


def host_reads_of_a_fit(monkeypatch, argv: list[str]) -> list[str]:
    """Run `train.py fit ARGV` in this process and return where each read of a tensor value happened."""
    reads: list[str] = []
    with monkeypatch.context() as patch:
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)

            def counting(tensor, *args, _original=original, _name=name, **kwargs):
                caller = traceback.extract_stack(limit=3)[0]
                # torch's optimizers keep their step counts on the CPU even when training on a GPU (unless
                # `capturable`), precisely so that reading them costs no synchronisation.
                if "/torch/optim/" not in caller.filename:
                    reads.append(f"{_name} in {caller.filename}:{caller.lineno}")
                return _original(tensor, *args, **kwargs)

            patch.setattr(torch.Tensor, name, counting)
        main(argv)
    return reads


def test_training_steps_between_logging_steps_read_nothing_from_the_device(data_dir, tmp_path, monkeypatch):
    """Reads at setup and teardown are fine; the count must not grow with the number of steps."""
    argv = [
        *("fit", "--model", "ConvNet", "--data.dataset", "mnist", "--data.data_dir", str(data_dir)),
        *("--data.val_size", "200", "--data.batch_size", "20", "--trainer.limit_val_batches", "0"),
        *("--trainer.log_every_n_steps", "1000", "--trainer.accelerator", "cpu", "--devices", "1"),
        *("--trainer.default_root_dir", str(tmp_path)),
    ]  # one epoch is 50 steps: both runs stay in the first epoch
    short = host_reads_of_a_fit(monkeypatch, [*argv, "--trainer.max_steps", "10"])
    long = host_reads_of_a_fit(monkeypatch, [*argv, "--trainer.max_steps", "40"])
    extra = Counter(long) - Counter(short)
    assert not extra, f"more reads in 30 more steps: {extra.most_common(5)}"
