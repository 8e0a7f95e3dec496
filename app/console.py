"""What train.py says: lines of its own below the progress bar, a mistake in one line, a bug in a short traceback
(docs/errors.md)."""

import contextlib
import difflib
import os
import re
import shutil
import socket
import sys
import sysconfig
import traceback
from pathlib import Path

import torch.distributed as dist
import yaml
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities import rank_zero_only
from tqdm import tqdm


class UserError(Exception):
    """A mistake the user can fix; the message says what is wrong and what to do. One that every process of the job
    makes alike (`every_process`) is said once, by global rank 0; one that some processes meet (a node's missing data)
    is said by each of them, with its rank and host. Before the processes meet, the first process of each node says
    its mistakes (each node's output is its own)."""

    def __init__(self, message: str, every_process: bool = False) -> None:
        super().__init__(message)
        self.every_process = every_process


def say(text: str) -> None:
    """Print `text` from global rank 0, on lines of its own below a progress bar (tqdm takes the bar away and draws
    it again), flushed: the process may end next."""
    if rank_zero_only.rank == 0:
        tqdm.write(text, file=sys.stdout)
        sys.stdout.flush()


def end_bars(trainer) -> None:
    """End a cut-short stage's progress bars where they stand (Lightning's close them only at a stage's end, and
    `tqdm.write` draws an open one again below each line said): what is said next stands on lines of its own."""
    for name in ("val_progress_bar", "train_progress_bar", "test_progress_bar", "predict_progress_bar"):
        with contextlib.suppress(AttributeError, TypeError):  # no such bar, or none open
            getattr(trainer.progress_bar_callback, name).close()


def options_of(settings: object, prefix: str = "-") -> dict[str, object]:
    """Settings as the options that set them: `{"model": {"class_path": "models.SeqNet", "init_args": {"width": 8}}}`
    as `{"--model": "models.SeqNet", "--model.width": 8}`."""
    if not isinstance(settings, dict):
        return {prefix: settings}
    options: dict[str, object] = {}
    for key, value in settings.items():
        name = prefix if key in ("class_path", "init_args") else f"{prefix}.{key}" if prefix != "-" else f"--{key}"
        options.update(options_of(value, key if str(key).startswith("--") else name))
    return options


def runnable(program: Path) -> str:
    """How to type `program` (an interpreter, a tool of its environment) where the user stands: its bare name where
    the PATH leads to it, else its path (`.venv/bin/python`, after the README's set-up without activating it)."""
    found = shutil.which(program.name)
    return program.name if found and Path(found).resolve() == program.resolve() else here(program)


def here(path: Path) -> str:
    """`path` from the current folder where it lies below it, else whole."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


def rank() -> int:
    """This process's global rank: the process group's once the processes have met, else the launcher's."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    env = os.environ
    if "RANK" in env or "SLURM_PROCID" in env:
        return int(env.get("RANK", env.get("SLURM_PROCID", "0")))
    return int(env.get("LOCAL_RANK", "0")) + (env.get("NODE_RANK", "0") != "0")  # 0 only for node 0's first


# What the processes of a job raise when another has gone (gloo, NCCL, torch's store): its own output says why.
PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited")
LOST = (
    "lost the connection to another process of the job, which ended first (its output says why; one killed by SIGKILL,"
    " for want of memory say, says nothing)."
)
TRACEBACK_VARIABLE = "TRAIN_TRACEBACK"  # TRAIN_TRACEBACK=1 keeps every error's whole traceback, on every process


def report(error: BaseException) -> None:
    """Say what went wrong: a mistake (`UserError`, Lightning's `MisconfigurationException`) in one line, a lost
    connection to another process in one line from global rank 0, anything else as a bug, in a short traceback."""
    me, met, env = rank(), dist.is_available() and dist.is_initialized(), os.environ
    place = f"rank {me}" if met or "RANK" in env or "SLURM_PROCID" in env else f"node {env.get('NODE_RANK', '0')}"
    who = "error" if me == 0 else f"error ({place} on {socket.gethostname()})"
    if isinstance(error, UserError | MisconfigurationException):  # said once where every process makes it alike
        first_of_node = env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0")) == "0"
        said = (me == 0 or not getattr(error, "every_process", False)) if met else first_of_node
        line = " ".join(str(error).split()) if said else ""
    elif met and PEER_LOST.search(str(error)):
        line = "" if me else LOST
    else:
        line = (
            f"an unexpected {type(error).__name__}, a bug rather than a mistake in the command; library frames are"
            f" summed up ({TRACEBACK_VARIABLE}=1 shows them all).\n{short_traceback(error)}"
        )
    if line:
        print(f"{who}: {line}", file=sys.stderr, flush=True)


LIBRARIES = [Path(sysconfig.get_paths()[name]) for name in ("purelib", "platlib", "stdlib", "platstdlib")]


def short_traceback(error: BaseException) -> str:
    """Python's traceback of `error` and its causes, each run of library frames one line; the raising frame stays."""
    chain = [traceback.TracebackException.from_exception(error)]
    while chain[-1].__cause__ or (chain[-1].__context__ and not chain[-1].__suppress_context__):
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    parts = []
    for exception in reversed(chain):
        parts.append("Traceback (most recent call last):\n")
        hidden: list[str] = []
        for index, frame in enumerate(exception.stack):
            library = _library_of(frame.filename)
            if library and index < len(exception.stack) - 1:
                hidden.append(library)
                continue
            if hidden:
                parts.append(f"  ... {len(hidden)} frame(s) in {', '.join(dict.fromkeys(hidden))}\n")
                hidden = []
            parts += traceback.StackSummary.from_list([frame]).format()
        parts += [*exception.format_exception_only(), "\nwhich caused:\n\n"]
    return "".join(parts[:-1]).rstrip("\n")


def _library_of(filename: str) -> str | None:
    path = Path(filename)
    if filename.startswith("<"):
        return "python"
    for folder in LIBRARIES:
        if path.is_relative_to(folder):
            inside = path.relative_to(folder).parts
            return inside[0].removesuffix(".py") if folder.name.endswith("-packages") else "python"
    return None


# Options of Lightning 1.x (0.10 to 1.9) a config or command line may still hold, and how to say the same today: the
# Trainer's by their name, ModelCheckpoint's (--checkpoint, --last_checkpoint) as `checkpoint.NAME`.
OLDER_NAMES = {
    "gpus": "--trainer.devices N with --trainer.accelerator gpu",
    "tpu_cores": "--trainer.devices N with --trainer.accelerator tpu",
    "ipus": "nothing: Graphcore IPUs went with Lightning 2.0 (lightning-graphcore)",
    "hpus": "nothing here: Intel Gaudi (HPU) training went to the lightning-habana package",
    "num_processes": "--trainer.devices N (processes on the CPU with --trainer.accelerator cpu)",
    "auto_select_gpus": "--trainer.devices auto",
    "distributed_backend": "--trainer.strategy (ddp)",
    "resume_from_checkpoint": "--ckpt_path (a file, a run's folder, or last)",
    "checkpoint_callback": "--trainer.enable_checkpointing",
    "weights_summary": "--trainer.enable_model_summary",
    "progress_bar_refresh_rate": "--trainer.enable_progress_bar",
    "process_position": "a TQDMProgressBar in --trainer.callbacks",
    "weights_save_path": "--checkpoint.dirpath, or --trainer.default_root_dir",
    "replace_sampler_ddp": "--trainer.use_distributed_sampler",
    "reload_dataloaders_every_epoch": "--trainer.reload_dataloaders_every_n_epochs 1",
    "amp_backend": "--trainer.precision 16-mixed",
    "amp_level": "--trainer.precision 16-mixed",
    "terminate_on_nan": "nothing: a NaN or infinite loss stops every process here (--stop)",
    "stochastic_weight_avg": "a StochasticWeightAveraging in --trainer.callbacks",
    "log_gpu_memory": "a DeviceStatsMonitor in --trainer.callbacks",
    "track_grad_norm": "--trainer.gradient_clip_val, or a callback logging lightning.pytorch.utilities.grad_norm",
    "flush_logs_every_n_steps": "nothing: the logger flushes on its own",
    "log_save_interval": "nothing: the logger flushes on its own",
    "row_log_interval": "--trainer.log_every_n_steps",
    "auto_lr_find": "Lightning's Tuner.lr_find, outside the command line",
    "auto_scale_batch_size": "Lightning's Tuner.scale_batch_size, outside the command line",
    "move_metrics_to_cpu": "nothing: it went with Lightning 2.0",
    "multiple_trainloader_mode": "nothing: it went with Lightning 2.0",
    "truncated_bptt_steps": "nothing: it went with Lightning 2.0",
    "enable_pl_optimizer": "nothing: it went with Lightning 1.3",
    "automatic_optimization": "nothing: the model's automatic_optimization attribute (True here)",
    "prepare_data_per_node": "nothing: it is the datamodule's attribute now",
    "checkpoint.period": "--checkpoint.every_n_epochs",
    "checkpoint.every_n_val_epochs": "--checkpoint.every_n_epochs",
    "checkpoint.filepath": "--checkpoint.dirpath and --checkpoint.filename",
    "checkpoint.prefix": "--checkpoint.filename",
}
# Values of Lightning 1.x for an accelerator or a strategy, and today's.
OLDER_VALUES = {
    **dict.fromkeys(("ddp", "ddp_spawn", "dp", "ddp2", "horovod"), "--trainer.strategy ddp"),
    "ddp_cpu": "--trainer.strategy ddp with --trainer.accelerator cpu",
    **dict.fromkeys(
        ("ddp_sharded", "ddp_sharded_spawn", "ddp_fully_sharded", "fsdp_native"), "--trainer.strategy fsdp"
    ),
}


def older_name(option: str) -> str | None:
    """Today's way to say what `option` of Lightning 1.x said (`--trainer.gpus`), or None for an option of today."""
    section, _, name = option.lstrip("-").rpartition(".")
    if section in ("checkpoint", "last_checkpoint"):  # the same class's options
        return (OLDER_NAMES.get(f"checkpoint.{name}") or "").replace("--checkpoint.", f"--{section}.") or None
    return OLDER_NAMES.get(name) if section in ("", "trainer") else None


def older_options(args: list[str]) -> list[str]:
    """The options of Lightning 1.x on the command line `args` and in the config files it names, in order."""
    found = []
    for index, arg in enumerate(args):
        name, has_value, value = arg.partition("=")
        if name in ("-c", "--config"):
            with contextlib.suppress(OSError, yaml.YAMLError, IndexError):
                settings = yaml.safe_load(Path(value if has_value else args[index + 1]).read_text())
                found += options_of(settings) if isinstance(settings, dict) else []
        found.append(name)
    return [option for option in dict.fromkeys(found) if option.startswith("--") and older_name(option)]


def parser_line(message: str, options: list[str], args: list[str] = (), subcommand: str = "fit") -> str:
    """jsonargparse's error `message` as one line: the option, its value and the deepest cause; an unknown option
    with today's name of a Lightning 1.x one, or the closest of `options` (`--trainer.max_epochs`, else the help of
    `subcommand`); `args`: the command line, where a value the message leaves out was typed."""
    unknown = re.search(
        r"unrecognized arguments: (\S+)|does not accept option '([^']+)'|Option '([^']+)' is not", message
    )
    keys = re.findall(r'Parser key "([^"]+)"', message)
    if unknown:
        name = next(group for group in unknown.groups() if group).lstrip("-").split("=")[0]
        option = "--" + ".".join([*keys, name] if unknown.group(3) else [name])
        if older_name(option):  # each of the command's, at once
            olders = [option, *(o for o in older_options(list(args)) if o != option)]
            today = "; ".join(f"{o} → {older_name(o)}" for o in olders) if olders[1:] else older_name(option)
            are = "are options" if olders[1:] else "is an option"
            return f"{', '.join(olders)} {are} of Lightning 1.x; today: {today}."
        return f"{option}: no such option{_closest(option, options, subcommand)}"
    lines = [line for line in message.splitlines() if line.strip() and "NoneType" not in line]
    causes = [line for line in lines if not re.match(r"\s*(Given value|Subtypes|Errors|Does not validate)", line)]
    deepest = max(causes, key=lambda line: len(line) - len(line.lstrip())).strip().lstrip("- ")
    given = re.findall(r"^( *)Given value: (.*?)(?:\. Got value.*)?$", message, re.MULTILINE)
    value = max(given, key=lambda found: len(found[0]))[1] if given else ""
    option = f"--{'.'.join(keys)}"
    if not value or value.startswith(("NestedArg", "{", "Namespace")):  # as typed, where it was
        typed = [
            b if a == option else a.partition("=")[2]
            for a, b in zip(args, [*args[1:], ""], strict=True)
            if a == option or a.startswith(f"{option}=")
        ]
        value = typed[-1] if typed else ""
    deepest = re.sub(r'^Parser key "[^"]+": ', "", deepest)
    return f"{option}{f' {value}' if value else ''}: {deepest}" if keys else " ".join(message.split())


def _closest(option: str, options: list[str], subcommand: str) -> str:
    """`; did you mean --trainer.max_epochs?` for the closest option by its whole name or its last part, or `.`."""
    last = {candidate.rsplit(".", 1)[-1].lstrip("-"): candidate for candidate in options}
    close = difflib.get_close_matches(option, options, n=1, cutoff=0.75)
    close = close or [
        last[name] for name in difflib.get_close_matches(option.rsplit(".", 1)[-1].lstrip("-"), last, n=1)
    ]
    return f"; did you mean {close[0]}?" if close else f". train.py {subcommand} --help lists every option."
