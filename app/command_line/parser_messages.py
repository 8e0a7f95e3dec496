"""jsonargparse's error messages (a tree of 900 characters for `--model.optimizer.lr abc`) cut down to the option
and the deepest cause, in words a user acts on."""

import difflib
import importlib
import re
import textwrap
from pathlib import Path

import yaml
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from lightning.pytorch.profilers import Profiler
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from app.command_line.argv import SUBCOMMANDS, subcommand_of, values_given
from app.invocation import train_py
from models import ImageClassifier

LIMIT = 300
# Where the class names of this program's class options come from (other options: the type in the message).
BASE_CLASSES = {
    "--model": ImageClassifier,
    "--model.optimizer": Optimizer,
    "--model.lr_scheduler": LRScheduler,
    "--trainer.callbacks": Callback,
    "--trainer.logger": Logger,
    "--trainer.profiler": Profiler,
}
KINDS = {
    "<class 'int'>": "an integer",
    "<class 'float'>": "a number",
    "<class 'bool'>": "true or false",
    "<class 'str'>": "a string",
    "<class 'dict'>": "a mapping",
    "<class 'tuple'>": "a list in brackets",  # of numbers of any kind: no example fits all
    "<class 'list'>": "a list such as [1, 2]",
    "<class 'NoneType'>": "null",
    "PositiveInt": "a positive integer",
    "NonNegativeInt": "an integer >= 0",
    "PositiveFloat": "a positive number",
    "NonNegativeFloat": "a number >= 0",
    "ClosedUnitInterval": "a number in [0, 1]",
    "OpenUnitInterval": "a number in (0, 1)",
    "timedelta": "a duration such as 0:30:00",
}


# What users of other training scripts type, for this program's options.
COMMON_NAMES = {
    "--epochs": "--trainer.max_epochs",
    "--num_epochs": "--trainer.max_epochs",
    "--steps": "--trainer.max_steps",
    "--learning_rate": "--model.optimizer.lr",
    "--bs": "--data.batch_size",
    "--workers": "--data.num_workers",
    "--seed": "--seed_everything",
    "--gpus": "--devices",
    "--nodes": "--num_nodes",
    "--output_dir": "--trainer.default_root_dir",
    "--resume": "--ckpt_path",
}


def shorten(message: str, argv: list[str], options: list[str] = ()) -> str:
    """The one line to print for a jsonargparse error `message` about the command line `argv`; `options`: every
    option name the command takes (`--trainer.max_epochs`), to point an unknown one at what it most likely meant."""
    message = _branch_tried(message)
    keys = re.findall(r'Parser key "([^"]+)"', message)
    if missing := re.search(r"argument ((?:-\w/)?--[\w.]+)\S*: expected one argument", message):
        return _cut(f"{_typed_without_value(missing.group(1), argv)}: a value is missing after it.")
    if tag := re.search(r"could not determine a constructor for the tag '([^']+)'", message):
        return _cut(_refused_tag(tag.group(1), message, argv))
    if said := _config_file_problem(message, argv, options):
        return _cut(said)
    if not keys:
        line = " ".join(message.split())
        unknown = re.search(r"nrecognized arguments: (--[\w.-]+)", line)
        guess = guess_option(unknown.group(1).split("=")[0], options) if unknown and options else None
        if guess:
            return _cut(f"{unknown.group(1).split('=')[0]}: no such option; did you mean {guess}?")
        stray = re.search(r"nrecognized arguments: (\w+)", line)
        if stray and stray.group(1) in SUBCOMMANDS:  # `train.py --data.dataset mnist test ...`
            if first := subcommand_of(argv):
                return _cut(f"{stray.group(1)}: a command takes one subcommand, and this one has {first} already.")
            return _cut(
                f"{stray.group(1)}: a subcommand comes first, before the options:"
                f" `{train_py()} {stray.group(1)} OPTIONS`."
            )
        if "unrecognized arguments" in line or "does not accept option" in line:
            line += f". `{train_py()} fit --help` lists every option."
        return _cut(line)
    option = "--" + ".".join(keys)
    deepest = _deepest_cause(message)
    value = _given_value(option, argv, deepest, message)
    classes = re.findall(r"class_path[=\s]'([\w.]+)'", deepest) or re.findall(r"class_path[=\s]'([\w.]+)'", message)
    rejected = re.search(r"Option '([^']+)' is not accepted", deepest) or re.search(
        r"unrecognized arguments: --(?:init_args\.)?([\w.]+)", deepest
    )
    if rejected:
        given, argument = rejected.group(1), rejected.group(1).split(".")[0]
        owner = classes[0] if classes else None  # the first class tried is the one the user named
        if owner is None or owner == "typing.Union":  # a class option that names no class yet
            return _cut(f"{option}.{given}: {option} names no class yet; name one first ({option} CLASS_NAME).")
        return _cut(
            f"{option}.{given}: {owner} takes no argument '{argument}'."
            f" `{train_py()} fit {option}.help {owner}` lists the arguments it takes."
        )
    if required := re.search(r"the following arguments are required: ([\w, ]+)", deepest):
        owner = classes[-1] if classes else option
        needed = ", ".join(f"{option}.{name.strip()}" for name in required.group(1).split(","))
        return _cut(f"{option} {owner}: {owner} needs {needed}; give it on the command line or in the config.")
    if ambiguous := re.search(
        r"Multiple subclasses with name (\w+)\. Give the full class path[^:]*: (.*?)\.?\n", deepest
    ):
        return _cut(f"{option} {ambiguous.group(1)}: several classes have that name; give one of {ambiguous.group(2)}.")
    nested = re.search(r"Given value: NestedArg\(key='([^']+)'", message)
    if nested and "Problem with given class_path" not in message:  # `--trainer.strategy ddp --trainer.strategy.timeout`
        typed = values_given(argv, option)
        named = f" {typed[-1]}" if typed else ""
        return _cut(
            f"{option}.{nested.group(1)}: {option}{named} names no class, so it takes no arguments; name one first"
            f" ({option} CLASS_NAME)."
        )
    expected = _expected_kinds(deepest)
    looks_like_a_class = re.fullmatch(r"([a-z_]\w*\.)*[A-Z]\w*", value) is not None
    no_class = ("import path", "has no attribute", "No module named")
    if any(words in deepest for words in no_class) and (looks_like_a_class or not expected):
        return _cut(f"{option} {value}: no such class. {_choices(option, message)}")
    if expected:
        return _cut(f"{option} {value}: expected {' or '.join(expected)}.")
    return _cut(f"{option}: {' '.join(deepest.split())}")


def _branch_tried(message: str) -> str:
    """`message` with, at each choice jsonargparse tried among classes, or between a config file's name and a class
    (sibling lines that start with "- "), only the branch of the class the user named (else the first that is no
    file name): the others' errors are about what the user did not ask for (`lightning.Callback takes no argument
    'patience'` when EarlyStopping's patience is no integer)."""
    lines, index = message.split("\n"), 0
    while index < len(lines):
        indent = _indent(lines[index])
        if not lines[index].lstrip().startswith("- "):
            index += 1
            continue
        branches, end = [], index
        while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) >= indent):
            if _indent(lines[end]) == indent and lines[end].lstrip().startswith("- "):
                branches.append([])
            elif _indent(lines[end]) == indent and lines[end].strip():
                break
            branches[-1].append(lines[end])
            end += 1
        named = [branch for branch in branches if "Problem with given class_path" in "\n".join(branch)]
        not_a_path = [branch for branch in branches if "Expected a path" not in branch[0]]  # a config file's name
        if named or len(not_a_path) < len(branches):
            chosen = (named or not_a_path or branches)[0]
            lines[index:end] = [chosen[0].replace("- ", "", 1), *chosen[1:]]
            index += 1
        else:  # the types of a Union of plain values: each says what the option takes
            index = end
    return "\n".join(lines)


def _deepest_cause(message: str) -> str:
    """What jsonargparse says under the innermost parser key: the rest of its line, and the lines below it indented
    further (not the outer keys' own lines that follow, such as the whole config's `Given value`)."""
    start = message.rfind('Parser key "')
    indent = _indent(message[message.rfind("\n", 0, start) + 1 :])
    first, *below = message[start:].split(":", 1)[1].split("\n")
    block = [first]
    for line in below:
        if line.strip() and _indent(line) <= indent:
            break
        block.append(line)
    return "\n".join(block) + "\n"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _typed_without_value(option: str, argv: list[str]) -> str:
    """The option typed without its value that argparse names by the option it belongs to (`--model` for
    `--model.optimizer.lr`): the last one that nothing but another option follows."""
    names = option.split("/")  # `-c/--config`
    for index in range(len(argv) - 1, -1, -1):
        token = argv[index]
        follows = argv[index + 1] if index + 1 < len(argv) else "-"
        an_option_follows = follows.startswith("-") and not re.fullmatch(r"-[\d.]+(e-?\d+)?", follows)
        if any(token == name or token.startswith(f"{name}.") for name in names) and an_option_follows:
            return token
    return names[-1]


def _config_file_problem(message: str, argv: list[str], options: list[str]) -> str | None:
    """A config file that is no YAML, is empty, or sets an option that does not exist, named with its file (the
    parser says "<unicode string>", or nothing); None for other messages, or where no file is to blame."""
    configs = _configs_named(argv)
    if "Problems parsing config" in message and (refused := next((c for c in configs if _refuses(c)), None)):
        text = message.partition("Problems parsing config:")[2]
        lines = re.findall(r'in "<unicode string>", line (\d+)', text)
        problem = " ".join(re.sub(r'\s*in "<unicode string>", line \d+, column \d+', "", text).split())
        place = f", line {lines[-1]}" if lines else ""
        return f"--config {refused}{place}: not valid YAML ({problem.rstrip('.')})."
    if "Unexpected config:" in message:  # an empty file, or YAML that is no mapping (`hello`, a list)
        read = {config: _read(config) for config in configs if Path(config).is_file()}
        if odd := next((config for config, settings in read.items() if not isinstance(settings, dict)), None):
            said = (
                " is empty"
                if read[odd] is None
                else f" holds `{textwrap.shorten(Path(odd).read_text(), 40)}`, not settings"
            )
            return f"--config {odd}{said}. Put settings there (`{train_py()} fit --print_config` prints them all)."
    unknown = re.search(r"does not accept option '([\w.]+)'", message)
    if unknown and configs and not values_given(argv, f"--{unknown.group(1)}"):  # not typed: from a config file
        name = "--" + unknown.group(1).removesuffix(".class_path").removesuffix(".init_args")
        guess = guess_option(name, options) if options else None
        hint = f"did you mean {guess}?" if guess else f"`{train_py()} fit --help` lists every option."
        keys, source = unknown.group(1).split("."), "a config"  # none of the files: a config typed inline
        for config in configs:  # the last file that sets it wins
            settings = _read(config)
            if _holds(settings, keys) or _holds(settings, [subcommand_of(argv), *keys]):
                source = config
        return f"{name} (from {source}): no such option; {hint}"
    return None


def _holds(config: object, keys: list) -> bool:
    for key in keys:
        if not isinstance(config, dict) or key not in config:
            return False
        config = config[key]
    return True


def _read(path: str) -> object:
    """A config file's YAML; None where it cannot be read (an inline config, say)."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None


def _refused_tag(tag: str, message: str, argv: list[str]) -> str:
    """A YAML tag that would build a Python object (`!!python/object/apply:os.system`), refused, naming the file."""
    refused = next((path for path in _configs_named(argv) if _refuses(path)), None)
    where = re.search(r"line (\d+), column (\d+)", message)
    place = f", line {where.group(1)}" if where else ""
    source = f"--config {refused}{place}" if refused else f"a config given on the command line{place}"
    shown = f"!!{tag.removeprefix('tag:yaml.org,2002:')}" if tag.startswith("tag:yaml.org,2002:") else tag
    return (
        f"{source}: the tag {shown} is refused: a config holds plain values (numbers, strings, lists, mappings),"
        " nothing that builds Python objects. Remove the tag; a class is given as class_path and init_args."
    )


def config_not_text(argv: list[str]) -> str | None:
    """The line for a config file that is no text (a checkpoint, a picture), which the parser fails to decode."""
    for path in _configs_named(argv):
        try:
            Path(path).read_text()
        except UnicodeDecodeError:
            how = f"`{train_py()} fit --print_config` prints them all"
            return f"--config {path} is not a text file: give a YAML file of settings ({how})."
        except OSError:
            continue
    return None


def _configs_named(argv: list[str]) -> list[str]:
    """The config files the command line names: `-c FILE`, `--config FILE`, `--config=FILE`."""
    return values_given(argv, "-c") + values_given(argv, "--config")


def _refuses(path: str) -> bool:
    try:
        yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError:
        return True
    except (OSError, UnicodeDecodeError):
        return False
    return False


def guess_option(unknown: str, options: list[str]) -> str | None:
    """The option an unknown `--name` most likely meant: a common name from other scripts (`--epochs`), the one
    option whose last part it is (`--lr`: `--model.optimizer.lr`), or the nearest spelling (`--data.datset`)."""
    if unknown in COMMON_NAMES:
        return COMMON_NAMES[unknown]
    options = [option for option in options if not unknown.startswith(f"{option}.")]  # not its own parent
    name = unknown.removeprefix("--").rsplit(".", 1)[-1]  # `--model.lr`: lr
    ending = [option for option in options if option.rsplit(".", 1)[-1].lstrip("-") == name and option != unknown]
    starting = [option for option in options if option.startswith(unknown)]
    for candidates in (ending, starting):
        if len(candidates) == 1:
            return candidates[0]
    nearest = difflib.get_close_matches(unknown, options, n=1, cutoff=0.8)
    return nearest[0] if nearest else None


def _given_value(option: str, argv: list[str], deepest: str, message: str) -> str:
    """The value jsonargparse refused, as the user typed it: of an option given several times the first bad one,
    which its message names; a value of a config file where no typed one is it. Where the message names none,
    the value typed, or every value typed."""
    given = values_given([token.replace("+=", "=", 1) for token in argv], option)  # `--trainer.callbacks+=Nope`
    if reported := _reported_value(deepest) or _reported_value(message):  # the innermost key's, else an outer's
        whole = re.compile(rf"(?<![\w.]){re.escape(reported)}(?![\w.])")  # `x` in `[0.9,x]`, not `0` in `10`
        if typed := [value for value in given if value.strip() == reported] or [v for v in given if whole.search(v)]:
            return _as_typed(typed[0])
        if _configs_named(argv):
            return f"{reported} (from a config file)"
        if not given:
            return reported
    if len(given) > 1:
        return f"(given {len(given)} times: {', '.join(map(_as_typed, given))})"
    return _as_typed(given[0]) if given else ""


def _as_typed(value: str) -> str:
    """A value as the user typed it; an empty one (`--data.dataset=`) as ''."""
    return value if value.strip() else f"'{value}'"


def _reported_value(deepest: str) -> str:
    if found := re.search(r"'class_path': '([\w.]+)'", deepest):  # a class named in a config file
        return found.group(1)
    if found := (
        re.search(r"NestedArg\(key='[^']*', val=(?:'([^']*)'|\"([^\"]*)\")\)", deepest)
        or re.search(r"(?:Given|Got) value: (.*?)(?:\. Got value:|$)", deepest, re.MULTILINE)
        or re.search(r"(\S+) does not conform to restriction", deepest)
        or re.search(r"Not of type \w+: (?:'([^']*)'|\"([^\"]*)\"): expected", deepest)  # a type of ours (DatasetName)
        or re.search(r"invalid literal for \w+\(\)[^:]*: '([^']*)'|could not convert string to \w+: '([^']*)'", deepest)
    ):
        value = next(group for group in found.groups() if group is not None).strip()
        named = re.match(r"Namespace\(class_path='([\w.]+)'", value)  # a class given as a mapping
        return named.group(1) if named else value
    return ""


def _expected_kinds(deepest: str) -> list[str]:
    """What the option takes, in words, when the deepest cause names basic types (not a class)."""
    kinds = []
    for restriction, expecting in re.findall(
        r"Not of type (\w+)(?:: (?:'[^']*': |\"[^\"]*\": )?expected ([^\n]+))?", deepest
    ):
        kinds.append(expecting.strip() or KINDS.get(restriction, restriction))  # a type of ours says what it takes
    literals = [
        item.strip().strip("'")
        for found in re.findall(r"Expected a typing\.Literal\[(.*?)\]", deepest)
        for item in found.split(",")
    ]
    if literals:
        kinds.append("one of " + ", ".join(dict.fromkeys(literals)))
    kinds += [f"a list of {count} values" for count in re.findall(r"Expected a tuple with (\d+) elements", deepest)]
    for name in re.findall(r"Expected a (<class '[\w.]+'>)", deepest):
        if name in KINDS:
            kinds.append(KINDS[name])
    return list(dict.fromkeys(kind for kind in kinds if kind != "null" or len(kinds) > 1))


def _choices(option: str, message: str) -> str:
    """Where the valid class names come from: the subclasses of the type the option takes."""
    base = BASE_CLASSES.get(option) or _type_in(message)
    if base is None:
        return "Give a class name or a full import path such as mypackage.MyClass."
    subclasses = sorted({cls.__name__ for cls in _subclasses(base) if not cls.__name__.startswith("_")})
    shown = ", ".join(subclasses[:6]) + (", ..." if len(subclasses) > 6 else "")
    return f"Name a subclass of {base.__module__}.{base.__name__} ({shown}) or give a full import path."


def _type_in(message: str) -> type | None:
    for path in re.findall(r"([a-z_]\w*(?:\.\w+)+\.[A-Z]\w*)", message.split("Errors:")[0]):
        module_name, _, class_name = path.rpartition(".")
        try:
            return getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            continue
    return None


def _subclasses(base: type) -> list[type]:
    found = []
    for cls in base.__subclasses__():
        found += [cls, *_subclasses(cls)]
    return found


def _cut(line: str) -> str:
    return line if len(line) <= LIMIT else line[: LIMIT - 3] + "..."
