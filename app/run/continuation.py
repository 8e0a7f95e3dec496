"""What `--ckpt_path` starts from: a run to continue (`last`, or a run's folder) or a checkpoint file, the settings
that come with it as defaults, and what the command line changes on top of them (docs/run-folder.md). How a run
trains may change (`replan.py`); what the network is may not."""

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning.pytorch.plugins.environments import SLURMEnvironment
from torch import nn

from app.errors import UserError
from app.run.checkpoints import imported_class, not_a_checkpoint_folder, read_checkpoint
from app.run.folder import (
    is_run,
    last_checkpoint_of,
    newest_record,
    newest_run_with_a_checkpoint,
    read_record,
    trained_runs_in,
    versions,
)

NOT_COMPARED = {"ckpt_path", "config", "weights_only"}  # options that say where to start, not how to train
# Where a run is and on how many processes it runs: the command's now (the global batch is kept).
WHERE = {"--trainer.default_root_dir", "--trainer.devices", "--trainer.num_nodes"}
# The data a run trains and validates on, which a continued run keeps (an interrupted epoch gives each sample once).
DATA_OF_THE_RUN = {"--data.dataset", "--data.val_size", "--data.val_split_seed"}
STATISTICS = ("--model.pixel_mean", "--model.pixel_std")  # the normalisation the weights were trained with
LIGHTNING_NAMES = ("hpc",)  # `--ckpt_path` values that Lightning resolves itself


@dataclass(frozen=True)
class Change:
    option: str  # as on the command line: --trainer.max_epochs, --model.optimizer (a class), --model.optimizer.lr
    before: Any
    after: Any
    lr: float | None = None  # a new optimizer's learning rate

    def __str__(self) -> str:
        lr = f" (lr {self.lr:g})" if self.lr is not None else ""
        return f"{self.option} {shown(self.before)} -> {shown(self.after)}{lr}"


@dataclass
class Start:
    """Where a command starts from: `checkpoint`, of the run `run` when it continues one."""

    checkpoint: Path
    contents: dict  # the checkpoint as read (weights-only)
    run: Path | None = None  # the run continued; None for a checkpoint file
    record: Path | None = None  # the run's newest record of its settings
    settings: dict = field(default_factory=dict)  # the defaults it brings, as a config file would give them
    changes: list[Change] = field(default_factory=list)

    @property
    def where(self) -> str:
        """`runs/SeqNet-mnist/version_0, from checkpoints/last.ckpt (step 16, epoch 1)`: one phrase for the user."""
        if self.run is None:
            place = str(self.checkpoint)
        else:  # a checkpoint of the run's, where a user put it (--last_checkpoint.dirpath)
            inside = self.checkpoint.is_relative_to(self.run)
            place = f"{self.run}, from {self.checkpoint.relative_to(self.run) if inside else self.checkpoint}"
        return f"{place} (step {self.contents.get('global_step', 0)}, epoch {self.contents.get('epoch', 0)})"

    def defaults_argument(self, subcommand: str) -> list[str]:
        """The settings it brings, as a config of the whole command line (`--config '{"fit": ...}'`) placed first:
        every config file and option the user gives comes after it and wins."""
        return ["--config", json.dumps({subcommand: self.settings})] if self.settings else []


def find_start(ckpt_path: str | None, subcommand: str, runs_of_model: Path, root: Path) -> Start | None:
    """The run or checkpoint `--ckpt_path` names, read and checked; None where Lightning resolves the name, for no
    checkpoint, and for `fit --ckpt_path last` with nothing to continue."""
    if ckpt_path == "":  # `--ckpt_path "$CKPT"` with the variable unset: Lightning would take it for a file
        raise UserError("--ckpt_path '': an empty value names no checkpoint. Give last, a run's folder or a file.")
    if ckpt_path == "best":  # Lightning's: a fit's best in the same process, which a new train.py never has
        raise UserError(
            "--ckpt_path best names the best checkpoint of a fit earlier in the same process, and this command has"
            " none: give the file a fit's 'Best checkpoint:' line names, a run's folder, or last."
        )
    if not ckpt_path or resolved_by_lightning(ckpt_path):
        return None
    if ckpt_path == "last":
        run = _run_to_continue(runs_of_model, root)
        if run is None:
            if subcommand == "fit":
                return None
            others = " or ".join(trained_runs_in(runs_of_model.parent))
            how = f"Runs of other models or data are named with {others}" if others else "Train first"
            raise UserError(
                f"--ckpt_path last: no run under {runs_of_model} holds a last checkpoint. {how}, or give --ckpt_path"
                " a run's folder or a checkpoint file."
            )
        return _from_run(run, root, subcommand)
    path = Path(ckpt_path)
    if path.is_dir() and is_run(path):  # a link to a run is the run itself (its checkpoints name its folder)
        return _from_run(path.resolve() if path.is_symlink() else path, root, subcommand)
    runs = [path / f"version_{number}" for number in sorted(versions(path), reverse=True)]
    if trained := [run.name for run in runs if last_checkpoint_of(run) is not None]:  # `runs/SeqNet-mnist`
        raise UserError(not_a_checkpoint_folder("--ckpt_path", path, trained))
    contents = read_checkpoint(path)
    return Start(path, contents, settings=_settings_of_checkpoint(contents))


def resolved_by_lightning(ckpt_path: str) -> bool:
    """A `--ckpt_path` that names no file of its own: `hpc`, a model registry's name, a URL."""
    return ckpt_path in LIGHTNING_NAMES or ckpt_path.startswith("registry") or "://" in ckpt_path


def _run_to_continue(runs_of_model: Path, root: Path) -> Path | None:
    """The newest run that holds a last checkpoint; under SLURM, the newest run at all when Lightning's pre-emption
    checkpoint (`hpc_ckpt_N.ckpt`, in the root) is there."""
    run = newest_run_with_a_checkpoint(runs_of_model)
    if run is None and _slurm_checkpoint(root) is not None and versions(runs_of_model):
        run = runs_of_model / f"version_{max(versions(runs_of_model))}"
    return run


def _slurm_checkpoint(root: Path) -> Path | None:
    if not SLURMEnvironment.detect():
        return None
    return max(root.glob("hpc_ckpt_*.ckpt"), key=lambda path: path.stat().st_mtime, default=None)


def _from_run(run: Path, root: Path, subcommand: str) -> Start:
    """Continue `run` from its newest last checkpoint (or SLURM's, when newer), with its newest record's settings;
    evaluate that checkpoint with its own settings, as when the file is named (the record's trainer settings, its
    `limit_test_batches` say, would evaluate part of the data)."""
    candidates = [path for path in (last_checkpoint_of(run), _slurm_checkpoint(root)) if path is not None]
    if not candidates:
        raise UserError(f"--ckpt_path {run}: this run holds no last checkpoint yet. Train it first, or start afresh.")
    checkpoint = max(candidates, key=lambda path: path.stat().st_mtime)
    contents = read_checkpoint(checkpoint)
    record = newest_record(run) if subcommand == "fit" else None
    if record is None:
        return Start(checkpoint, contents, run, settings=_settings_of_checkpoint(contents))
    settings = read_record(record)
    settings = {key: value for key, value in settings.items() if key not in NOT_COMPARED}
    _with_the_weights_statistics(settings, contents)
    for key in WHERE:  # where the run was, and on how many processes: this command, or its launcher, says now
        (settings.get("trainer") or {}).pop(key.removeprefix("--trainer."), None)
    return Start(checkpoint, contents, run, record, settings)


def _with_the_weights_statistics(settings: dict, contents: dict) -> None:
    """A record's model without normalisation (taken from the data when the run started) given the checkpoint's:
    the run was built with those, and another given to continue it is then said to differ from them."""
    model = settings.get("model")
    saved = contents.get("hyper_parameters") or {}
    if not isinstance(model, dict) or saved.get("pixel_mean") is None:
        return
    arguments = model.setdefault("init_args", {})
    if arguments.get("pixel_mean") is None or arguments.get("pixel_std") is None:
        arguments.update(pixel_mean=saved["pixel_mean"], pixel_std=saved["pixel_std"])


def _settings_of_checkpoint(contents: dict) -> dict:
    """A checkpoint's own model and data settings (LightningCLI saves them with the weights)."""
    model = dict(contents.get("hyper_parameters") or {})
    data = dict(contents.get("datamodule_hyper_parameters") or {})
    for hparams in (model, data):
        hparams.pop("_instantiator", None)
    settings = {"data": data} if data else {}
    if "_class_path" in model:
        settings["model"] = {"class_path": model.pop("_class_path"), "init_args": model}
    return settings


def changes_between(before: dict, after: dict) -> list[Change]:
    """The options whose value differs, by their command-line names; a changed class is one change. A normalisation
    left null (a `--print_config` file's) changes nothing: the weights bring theirs (`refuse_other_statistics`)."""
    before = {key: value for key, value in before.items() if key not in NOT_COMPARED}
    after = {key: value for key, value in after.items() if key not in NOT_COMPARED and key in before}
    return [
        change
        for change in differences(before, after, "-")
        if change.option not in WHERE and not (change.option in STATISTICS and change.after is None)
    ]


def differences(before: Any, after: Any, option: str = "-") -> list[Change]:
    """Every option whose value differs, by its command-line name (`option`: the prefix; "-" at the top)."""
    if before == after:
        return []
    if _is_class(before) or _is_class(after):  # a class and its arguments, or null
        if _class_of(before) != _class_of(after):
            # The new class's learning rate, which jsonargparse carries over from the old class when both take one
            lr = (after.get("init_args") or {}).get("lr") if _is_class(after) else None
            return [Change(option, _class_of(before), _class_of(after), lr)]
        class_path, before, after = before["class_path"], before.get("init_args") or {}, after.get("init_args") or {}
        # An argument the class gained after the run was recorded, at its default: what the run was built with.
        after = {key: value for key, value in after.items() if key in before or not _is_default(class_path, key, value)}
    if isinstance(before, dict) and isinstance(after, dict):
        separator = "." if option != "-" else "-"
        return [
            change
            for key in dict.fromkeys([*before, *after])
            for change in differences(before.get(key), after.get(key), f"{option}{separator}{key}")
        ]
    return [Change(option, before, after)]


def model_changes(changes: list[Change], training_settings: tuple[str, ...]) -> list[Change]:
    """The changes of what the network is: its class, and its settings other than `training_settings`."""
    return [
        change
        for change in changes
        if change.option == "--model"
        or (change.option.startswith("--model.") and change.option.split(".")[1] not in training_settings)
    ]


def _is_default(class_path: str, key: str, value: Any) -> bool:
    """Whether `value` is the default of argument `key` of class `class_path` (or of the base class that its
    `**kwargs` hand `key` on to)."""
    cls = imported_class(class_path)  # imported already: the command names the same class
    if cls is None:
        return False
    for klass in inspect.getmro(cls):
        try:
            parameter = inspect.signature(klass.__init__).parameters.get(key)
        except (TypeError, ValueError):  # a class written in C may tell no signature
            continue
        if parameter is not None:
            return parameter.default is not inspect.Parameter.empty and _plain(parameter.default) == _plain(value)
    return False


def _plain(value: Any) -> Any:
    """A value as a record holds it (a tuple as a list), to compare a default with a recorded or parsed value."""
    return json.loads(json.dumps(value, default=str))


def _is_class(value: Any) -> bool:
    return isinstance(value, dict) and "class_path" in value


def _class_of(value: Any) -> Any:
    return value["class_path"] if _is_class(value) else value


def refuse_another(start: Start, option: str, holds: str, why: str = "") -> None:
    """`option` (`--model`, `--data.dataset`) naming another than the checkpoint's: one line, whichever way it started.
    `holds` says what the checkpoint holds ("a", "a model trained on"); `why` what another would do."""
    for change in start.changes:
        if change.option == option:
            saved = f"{holds} {shown(change.before)}"
            raise UserError(
                another_than_the_checkpoints(start.run or start.checkpoint, saved, option, shown(change.after), why)
            )


def another_than_the_checkpoints(checkpoint: object, holds: str, option: str, chosen: str, why: str = "") -> str:
    """The line for `option` naming `chosen` where the checkpoint holds another (`holds`: "a SeqNet"), which is used;
    `export` says it too."""
    return (
        f"--ckpt_path {checkpoint} holds {holds}, but {option} names {chosen}{why}: leave {option} out (the"
        f" checkpoint's is used), or give a checkpoint of {chosen}."
    )


def refuse_other_statistics(start: Start) -> None:
    """The normalisation the weights were trained with comes with them (`ImageClassifier.on_load_checkpoint`):
    another one given for them is refused in one line, where it was silently replaced (and recorded as used)."""
    for change in start.changes:
        if change.option in STATISTICS and None not in (change.before, change.after):
            raise UserError(
                f"{change.option} {shown(change.after)}: the weights of --ckpt_path {start.run or start.checkpoint}"
                f" were trained on inputs normalised with {change.option} {shown(change.before)}, which comes with"
                f" them. Leave {change.option} out."
            )


def refuse_another_model(start: Start, training_settings: tuple[str, ...]) -> None:
    """A continued run keeps its network and dataset: another model setting than `training_settings` is refused."""
    changed = model_changes(start.changes, training_settings)
    changed += [change for change in start.changes if change.option in DATA_OF_THE_RUN]
    if not changed:
        return
    said = " and ".join(f"{change.option} {shown(change.after)}" for change in changed)
    was = " and ".join(f"{change.option} {shown(change.before)}" for change in changed)
    source = start.record or start.checkpoint
    raise UserError(
        f"{said} does not fit the run it continues: {start.run} was built with {was}. A run continues with the model"
        f" and data it was started with: leave {' and '.join(c.option for c in changed)} out (the run's"
        f" settings, {source}, are the defaults), or train a new run without --ckpt_path."
    )


def refuse_weights_that_do_not_fit(model: nn.Module, start: Start, training_settings: tuple[str, ...]) -> None:
    """Say in one line why the checkpoint's weights do not fit the model: the settings, or else the tensors, that
    differ."""
    expected, saved = model.state_dict(), start.contents.get("state_dict", {})
    mismatched = [name for name in expected if name in saved and expected[name].shape != saved[name].shape]
    missing, unexpected = [n for n in expected if n not in saved], [n for n in saved if n not in expected]
    if not (mismatched or missing or unexpected):
        return
    model_name = type(model).__name__
    if changed := model_changes(start.changes, training_settings):
        said = " and ".join(f"{c.option} {shown(c.after)} (the checkpoint's: {shown(c.before)})" for c in changed)
        raise UserError(
            f"--ckpt_path {start.checkpoint} holds the weights of another {model_name} than {said} builds. Leave"
            f" {' and '.join(c.option for c in changed)} out: the checkpoint's settings are the defaults."
        )
    if mismatched:
        name = mismatched[0]
        what = f"{name} is {list(saved[name].shape)} there but {list(expected[name].shape)} in the model"
    else:
        what = f"missing: {missing[0]}" if missing else f"not in the model: {unexpected[0]}"
    more = len(mismatched) + len(missing) + len(unexpected) - 1
    raise UserError(
        f"--ckpt_path {start.checkpoint} does not fit {model_name} as this code builds it ({what}"
        f"{f', and {more} more' if more else ''}). Give a checkpoint of this model."
    )


def shown(value: Any) -> str:
    """A setting's value as the command line takes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and "." in value and all(part.isidentifier() for part in value.split(".")):
        return value.rsplit(".", 1)[-1]  # a class path: its class
    if isinstance(value, list) and all(isinstance(item, dict) and "class_path" in item for item in value):
        return "[" + ", ".join(shown(item["class_path"]) for item in value) + "]"
    return "null" if value is None else str(value)
