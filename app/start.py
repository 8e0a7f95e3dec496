"""What `--ckpt_path` names: a checkpoint file, a run's folder, or `last`, the newest run of a model on a dataset
(`find_start`), the settings it brings, and where the command then writes (docs/run-folder.md)."""

import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml
from lightning.pytorch.utilities import rank_zero_info

from app.console import UserError, options_of
from app.errors import earlier_settings
from app.plugins.checkpoint_io import read_checkpoint
from app.runs import CHECKPOINTS, LAST, RunLogger, records, run_name, versions

# What a continued run may change beside the Trainer's settings: how fast it runs and what it reads from, not what
# it learns.
# fmt: off
MAY_CHANGE = ("--model.channels_last", "--model.compile", "--model.cuda_graph", "--data.data_dir", "--data.num_workers",
              "--data.pin_memory", "--data.on_device", "--data.eval_batch_size", "--data.batch_size",
              "--data.predict_dir")
# fmt: on


WHERE_IT_RUNS = ("devices", "num_nodes", "accelerator")  # the Trainer's settings a continued run takes anew


def newest_run(runs: Path) -> Path | None:
    """The run `--ckpt_path last` names: the highest `version_N` of `runs` that holds a last checkpoint."""
    found = [runs / f"version_{n}" for n in sorted(versions(runs), reverse=True)]
    return next((run for run in found if (run / CHECKPOINTS / LAST).is_file()), None)


@dataclass
class Start:
    """What a command starts from: `checkpoint`, in `run` (the run a fit continues, or whose checkpoint an evaluation
    evaluates), with `settings`: the defaults it brings (a continued run's newest record, else the checkpoint's own
    model and data settings)."""

    named: str  # as typed
    checkpoint: Path
    contents: dict
    run: Path | None
    settings: dict
    continues: bool = False

    def refuse_changes(self, now: dict, subcommand: str) -> None:
        """The network the weights were trained as stays (`now`: the command's settings); a fit keeps the optimizer
        and the data too, and a prediction the dataset, whose class names label the rows."""
        before, now = options_of(self.settings), options_of(now)
        kept = {"fit": ("--model", "--data"), "predict": ("--model", "--data.dataset")}.get(subcommand, ("--model",))
        fit, named = subcommand == "fit", self.run if self.continues else self.checkpoint
        for option in (o for o in before if o.startswith(kept) and not o.startswith(MAY_CHANGE)):
            if option in now and now[option] != before[option]:
                weights = shlex.quote(str(self.checkpoint))
                how = f", or start a new run from its weights (--model.weights {weights})" if fit else ""
                raise UserError(
                    f"{option} {now[option]}: --ckpt_path {named} was trained with {option} {before[option]}, which"
                    f" {'it continues with' if fit else 'its weights need'}. Leave {option} out (the checkpoint's is"
                    f" used){how}."
                )

    @property
    def where(self) -> str:
        place = f"{self.run}, from {self.checkpoint.relative_to(self.run)}" if self.continues else str(self.checkpoint)
        return f"{place} (step {self.contents.get('global_step', 0)}, epoch {self.contents.get('epoch', 0)})"

    def say(self, subcommand: str) -> None:
        """Say what the command starts from: the run it continues, the weights a new run or an evaluation takes."""
        how = ("continuing " if self.continues else "a new run from ") if subcommand == "fit" else ""
        named = "" if subcommand != "fit" and Path(self.named) == self.checkpoint else f" {self.named}:"
        rank_zero_info(f"--ckpt_path{named} {how}{self.where}.")


def where_it_runs(trainer: dict) -> list[str]:
    """The options of the Trainer's settings as given (`trainer`) that say where a run runs, the defaults left out:
    what a command that continues it takes again, as its record does not hold them."""
    defaults = {"devices": "auto", "num_nodes": 1, "accelerator": "auto"}  # Lightning's Trainer's
    options = {"devices": "--devices", "num_nodes": "--num_nodes", "accelerator": "--trainer.accelerator"}
    given = [(options[key], str(trainer.get(key))) for key in WHERE_IT_RUNS if trainer.get(key) != defaults[key]]
    return [part for option in given for part in option]


def find_start(ckpt_path: str | None, subcommand: str, runs: Path, weights_only: bool = True) -> Start | None:
    """The checkpoint `--ckpt_path` names, read (as data only, unless not `weights_only`) and checked; None for none,
    for a URL (Lightning reads it), and for `fit --ckpt_path last` with no run to
    continue (a new run starts)."""
    if ckpt_path is None and subcommand != "fit":
        raise UserError(
            f"{subcommand} needs trained weights: add --ckpt_path last (the newest run of this model and dataset), a"
            " run's folder, or a checkpoint file."
        )
    if ckpt_path is None or "://" in ckpt_path:  # a URL: Lightning reads it
        return None
    lightnings = ckpt_path in ("best", "hpc") or ckpt_path.lower().partition(":")[0] == "registry"  # its names
    if ckpt_path == "" or (lightnings and not Path(ckpt_path).exists()):
        raise UserError(
            f"--ckpt_path {ckpt_path or repr('')} names no checkpoint this program keeps: give a checkpoint file, a"
            f" run's folder, or last (train.py {subcommand} --help says what each means)."
        )
    run = newest_run(runs) if ckpt_path == "last" else Path(ckpt_path)
    if run is None:
        if subcommand == "fit":
            rank_zero_info(f"--ckpt_path last: nothing to continue under {runs.parent}, starting a new run.")
            return None
        raise UserError(
            f"--ckpt_path last: no run in {runs} holds a last checkpoint. Train one first, or give"
            " --ckpt_path a checkpoint file or a run's folder (and --model, --data.dataset: its own)."
        )
    if run.is_dir():
        if not (run / CHECKPOINTS / LAST).is_file():
            held = [f"version_{n}" for n in sorted(versions(run))]
            inside = [name for name in held if (run / name / CHECKPOINTS / LAST).is_file()][-3:]  # the newest
            hint = f"it holds the runs {', '.join(inside)}: give one of them" if inside else "give a checkpoint file"
            raise UserError(f"--ckpt_path {run} is a folder without {CHECKPOINTS}/{LAST}; {hint}, or last.")
        checkpoint = run / CHECKPOINTS / LAST
        contents = read_checkpoint(checkpoint, weights_only)
        if subcommand == "fit" and records(run):  # continued in its folder, with its settings
            settings = yaml.safe_load(records(run)[-1].read_text())
            if not isinstance(settings, dict):
                raise UserError(
                    f"{records(run)[-1]} is damaged (it holds no settings): put back the file train.py"
                    " wrote, or remove it (the run then takes its previous record's settings)."
                )
            for key in ("ckpt_path", "config", "weights_only"):
                settings.pop(key, None)
            earlier_settings(settings, records(run)[-1])
            trainer = settings.get("trainer") or {}
            for key in WHERE_IT_RUNS:  # the processes, the nodes and the accelerator are the command's, as it runs now
                trainer.pop(key, None)
            if "plugins.environments." in str(plugins := trainer.pop("plugins", None)):  # a cluster's too (a pod's)
                plugins = [p for p in plugins if "environments." not in str(p)] if isinstance(plugins, list) else None
            if plugins:
                trainer["plugins"] = plugins
            return Start(ckpt_path, checkpoint, contents, run, settings, continues=True)
        return Start(ckpt_path, checkpoint, contents, run, checkpoint_settings(contents), subcommand == "fit")
    contents = read_checkpoint(run, weights_only)
    in_a_run = run.parent.name == CHECKPOINTS and records(run.parent.parent)
    return Start(ckpt_path, run, contents, run.parent.parent if in_a_run else None, checkpoint_settings(contents))


def checkpoint_settings(contents: dict) -> dict:
    """A checkpoint's model and data settings, as LightningCLI saves them with the weights, as a config's."""
    settings = {}
    for section, key in (("model", "hyper_parameters"), ("data", "datamodule_hyper_parameters")):
        saved = {name: value for name, value in (contents.get(key) or {}).items() if name != "_instantiator"}
        class_path = saved.pop("_class_path", None)
        if saved or class_path:
            settings[section] = {"class_path": class_path, "init_args": saved} if class_path else saved
    return settings


def run_logger(start: Start | None, subcommand: str, root: str, model: object, data: object) -> "RunLogger":
    """Where a command writes: the run it continues, a new `version_N` of the runs of `model` on the dataset of `data`
    (its `hparams.dataset`) in `root`, or for an evaluation `<run>/<stage>/version_N` beside the run whose checkpoint
    it evaluates."""
    runs = Path(root) / run_name(type(model).__name__, data.hparams.dataset)
    if start is not None and start.continues:
        return RunLogger(start.run.parent.parent, start.run.parent.name, version=start.run.name)
    if subcommand == "fit":
        return RunLogger(runs.parent, runs.name)
    return RunLogger(start.run if start is not None and start.run is not None else runs, subcommand)
