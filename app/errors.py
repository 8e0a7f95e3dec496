"""The mistakes a command line can hold, each as one line: jsonargparse's error at its deepest cause, the names of
Lightning 1.x with today's, and a value a class refused as it was built from the settings."""

import contextlib
import difflib
import re
from pathlib import Path

import yaml
from lightning.pytorch import Callback
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from app.console import UserError, options_of

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


# This program's own options that went, as its earlier versions wrote them into configs and run records: the default
# each had (a run's record that holds it asked for nothing: continued, it is dropped) and what says the same today.
EARLIER = {
    "fault_guard.every_n_steps": (50, "--stop.every_n_steps"),
    "fault_guard.stall_timeout": (60, "--watchdog.timeout"),
    "fault_guard.checkpoint_every_s": (None, "--stop.save_every_s"),
    "timed_checkpoint.train_time_interval": (None, "--stop.save_every_s (last.ckpt after so many seconds of training)"),
    "dashboard.num_images": (32, "nothing: the grid of validation samples went"),
    "dashboard.images_every_n_epochs": (1, "nothing: the model draws the confusion matrix of every validation"),
    "predictions.path": (None, "predict's alone (train.py predict --predictions.path FILE)"),
}
EARLIER_SECTIONS = ("fault_guard", "timed_checkpoint", "dashboard", "predictions")


def older_name(option: str) -> str | None:
    """Today's way to say what `option` of Lightning 1.x (`--trainer.gpus`) or of an earlier train.py
    (`--fault_guard.stall_timeout`) said, or None for an option of today."""
    section, _, name = option.lstrip("-").rpartition(".")
    if section in ("checkpoint", "last_checkpoint"):  # the same class's options
        return (OLDER_NAMES.get(f"checkpoint.{name}") or "").replace("--checkpoint.", f"--{section}.") or None
    earlier = EARLIER.get(f"{section}.{name}") or EARLIER.get(f"{section}.train_time_interval")  # (any of its own)
    return earlier[1] if earlier else OLDER_NAMES.get(name) if section in ("", "trainer") else None


def given_in(args: list[str]) -> dict[str, str | None]:
    """The options on the command line `args` and in the config files it names, in order, each with the file that
    holds it (None: the command line)."""
    found: dict[str, str | None] = {}
    for index, arg in enumerate(args):
        name, has_value, value = arg.partition("=")
        if name in ("-c", "--config"):
            with contextlib.suppress(OSError, yaml.YAMLError, IndexError):
                file = value if has_value else args[index + 1]
                settings = yaml.safe_load(Path(file).read_text())
                found |= dict.fromkeys(options_of(settings) if isinstance(settings, dict) else [], file)
        found.setdefault(name, None)
    return found


def older_options(args: list[str]) -> dict[str, str | None]:
    """The options of Lightning 1.x or of an earlier train.py `args` gives (`given_in`), with their files."""
    return {option: file for option, file in given_in(args).items() if option.startswith("--") and older_name(option)}


def earlier_settings(settings: dict, record: Path) -> None:
    """Drop from a run's `settings` (its `record`) the options an earlier train.py wrote that went, where they hold
    their default then (they asked for nothing); refuse, in one line naming each with today's way, those that do not."""
    given = {option[2:]: value for option, value in options_of(settings).items()}
    asked = [key for key in EARLIER if key in given and given[key] != EARLIER[key][0]]
    if asked:
        today = "; ".join(f"--{key} {given[key]} → {EARLIER[key][1]}" for key in asked)
        raise UserError(
            f"{record} holds options of an earlier train.py: {today}. Put today's in {record}, then run it."
        )
    for section, name in (key.split(".") for key in EARLIER):
        if isinstance(held := settings.get(section), dict):
            held.pop(name, None)
            if not held or section in ("fault_guard", "timed_checkpoint"):  # (the timed checkpoint's other options)
                settings.pop(section)


def parser_line(message: str, parser, args: list[str] = (), subcommand: str = "fit") -> str:
    """jsonargparse's error `message` as one line: the option, its value and the deepest cause; an unknown option
    with today's name of a Lightning 1.x one, or the closest of the options of `subcommand` in `parser`
    (`--trainer.max_epochs`, else its help); `args`: the command line, where a value the message leaves out was
    typed."""
    options = list(options_of(yaml.safe_load(parser.dump(parser.parse_args([subcommand])))[subcommand]))
    unknown = re.search(
        r"unrecognized arguments: (\S+)|does not accept option '([^']+)'|Option '([^']+)' is not", message
    )
    keys = re.findall(r'Parser key "([^"]+)"', message)
    if unknown:
        if (typed := next(group for group in unknown.groups() if group)) in LightningCLI.subcommands():
            return f"{typed} after options: the subcommand goes first (train.py {typed} OPTIONS)."
        name = typed.lstrip("-").split("=")[0]
        option = re.sub(r"\.init_args(?=\.)", "", "--" + ".".join([*keys, name] if unknown.group(3) else [name]))
        if older_name(option):  # each of the command's, at once, and the file that holds it
            return _older_line(option, older_options(list(args)))
        held = f" (in {file})" if (file := given_in(list(args)).get(option)) else ""
        if held and option in options:  # a file of the subcommand's settings, given before it
            return (
                f"{option}{held}: a --config before the subcommand holds each subcommand's settings under its name"
                f" ({subcommand}:); give this file after it: train.py {subcommand} --config FILE."
            )
        return f"{option}{held}: no such option{_closest(option, options, subcommand)}"
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
    if option in CLASSES and re.search(
        r"dot import path|not accessible or invalid|does not exist|not a subclass", deepest
    ):
        known = known_classes(option)  # a class's name: the known ones, and the closest
        close = [k for k in known if k.lower() == value.lower()] or difflib.get_close_matches(value, known, n=1)
        meant = f"; did you mean {close[0]}?" if close else "."
        more = " (a subclass of ImageClassifier in a file of models/ is one more)" if option == "--model" else ""
        return f"{option} {value}: no such {CLASSES[option]}{meant} Known: {', '.join(known)}{more}."
    return f"{option}{f' {value}' if value else ''}: {deepest}" if keys else " ".join(message.split())


# The options that name a class, by what they name; and other programs' names of options, with this program's.
CLASSES = {"--model": "model", "--model.optimizer": "optimizer", "--model.lr_scheduler": "learning-rate scheduler"}
ALIASES = {
    **dict.fromkeys(("learning_rate", "lr_rate", "base_lr"), "--model.optimizer.lr"),
    **dict.fromkeys(("num_epochs", "n_epochs", "nb_epochs", "epoch"), "--trainer.max_epochs"),
    **dict.fromkeys(("seed", "random_seed", "manual_seed"), "--seed_everything"),
    **dict.fromkeys(("bs", "batch", "train_batch_size", "per_device_train_batch_size"), "--data.batch_size"),
    **dict.fromkeys(("data_path", "dataset_dir", "data_root", "root"), "--data.data_dir"),
    **dict.fromkeys(("output_dir", "log_dir", "save_dir", "logdir", "run_dir"), "--trainer.default_root_dir"),
    **dict.fromkeys(("gpu", "num_gpus", "ngpus", "nproc_per_node", "world_size"), "--devices"),
    **dict.fromkeys(("nodes", "nnodes"), "--num_nodes"),
    **dict.fromkeys(("resume", "resume_from", "checkpoint_path", "load"), "--ckpt_path"),
    **dict.fromkeys(("workers", "num_worker", "dataloader_num_workers"), "--data.num_workers"),
}


def known_classes(option: str) -> list[str]:
    """The classes `option` (one of CLASSES) takes by their name: the models (a subclass of `ImageClassifier` in a file
    of models/ is one more), or torch's optimizers or learning-rate schedulers."""
    import torch  # noqa: PLC0415 (only where a name was mistyped)

    if option == "--model":
        from models import model_names  # noqa: PLC0415

        return model_names()
    optimizers = option == "--model.optimizer"
    module = torch.optim if optimizers else torch.optim.lr_scheduler
    base = torch.optim.Optimizer if optimizers else torch.optim.lr_scheduler.LRScheduler
    kinds = [(name, kind) for name, kind in vars(module).items() if isinstance(kind, type) and not name.startswith("_")]
    return sorted(name for name, kind in kinds if issubclass(kind, base) and kind is not base)


def _older_line(option: str, files: dict[str, str | None]) -> str:
    """The options of Lightning 1.x or an earlier train.py a command holds (`option`, and `files`: each with the file
    that holds it), by where they are, and today's way to say each."""
    olders = [option, *(o for o in files if o != option)]
    places = {file: [o for o in olders if files.get(o) == file] for file in dict.fromkeys(files.get(o) for o in olders)}
    named = ", ".join(
        ", ".join(these) if file is None else f"in {file}: {', '.join(these)}" for file, these in places.items()
    )
    ours = {o.lstrip("-").split(".")[0] in EARLIER_SECTIONS for o in olders}
    whose = " or ".join(
        name for name, theirs in (("Lightning 1.x", False), ("an earlier train.py", True)) if theirs in ours
    )
    today = "; ".join(f"{o} → {older_name(o)}" for o in olders) if olders[1:] else older_name(option)
    return f"{named} {'are options' if olders[1:] else 'is an option'} of {whose}; today: {today}."


def _closest(option: str, options: list[str], subcommand: str) -> str:
    """`; did you mean --trainer.max_epochs?` for this program's name of another's (`ALIASES`), the closest option by
    its whole name or its last part, or `.`."""
    if alias := ALIASES.get(option.rsplit(".", 1)[-1].lstrip("-")):
        return f"; did you mean {alias}?"
    last = {candidate.rsplit(".", 1)[-1].lstrip("-"): candidate for candidate in options}
    close = difflib.get_close_matches(option, options, n=1, cutoff=0.75)
    close = close or [
        last[name] for name in difflib.get_close_matches(option.rsplit(".", 1)[-1].lstrip("-"), last, n=1)
    ]
    return f"; did you mean {close[0]}?" if close else f". train.py {subcommand} --help lists every option."


def rejected(error: BaseException, settings: dict, sections: dict[str, type]) -> UserError | None:
    """What a class the command's `settings` name refused as it was built from them (a ValueError, TypeError or
    MisconfigurationException its `__init__` raised, which jsonargparse may wrap), as a mistake in one line naming
    the options of its section (`sections`: the class of each) the message names, by their name or by the value it
    quotes (a float or a word); a callback of `--trainer.callbacks` by its class. None for anything else (a bug, or a
    line that names its option already)."""
    cause = error
    while cause.__cause__ is not None:
        cause = cause.__cause__
    message = " ".join(str(cause).split())
    if not isinstance(cause, ValueError | TypeError | MisconfigurationException) or message.startswith("--"):
        return None
    frames, traceback = [], cause.__traceback__
    while traceback is not None:  # the outermost `__init__` of a section's class, with its arguments
        frames.append(traceback.tb_frame)
        traceback = traceback.tb_next
    classes = (*sections.values(), Callback)
    inits = [
        f.f_locals for f in frames if f.f_code.co_name == "__init__" and isinstance(f.f_locals.get("self"), classes)
    ]
    built = inits[0] if inits else {}
    candidates = [key for key, kind in sections.items() if isinstance(built.get("self"), kind)]
    words = set(re.findall(r"[\w.+-]+", str(cause).replace("`", " ")))

    def quoted(value: object) -> bool:  # a value the message quotes (numbers of other options would be chance)
        values = value if isinstance(value, list | tuple) else [value]
        return any(isinstance(v, float | str) and not isinstance(v, bool) and str(v) in words for v in values)

    def given(key: str) -> bool:  # the section's settings are the arguments it was being built with
        section = settings.get(key) or {}
        section = section.get("init_args", section)
        return all(str(section[name]) == str(value) for name, value in built.items() if name in section)

    candidates = [key for key in candidates if given(key)] or candidates
    arguments = {name: value for name, value in built.items() if name != "self"}
    if not candidates and any(name in words or quoted(value) for name, value in arguments.items()):
        return UserError(f"--trainer.callbacks {type(built['self']).__name__}: {message}")  # one of its arguments
    if not candidates:
        return None
    options = {o: v for o, v in options_of(settings).items() if o.lstrip("-").split(".")[0] == candidates[0]}

    named = [option for option in options if option.rsplit(".", 1)[-1] in words]
    chosen = [o for o in named if quoted(options[o])] or named or [o for o in options if quoted(options[o])]
    if not chosen:  # a message that names no value of the user's: a bug of the class
        return None
    return UserError(f"{' '.join(f'{option} {options[option]}' for option in chosen)}: {message}", every_process=True)
