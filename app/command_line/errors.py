"""Every mistake a user can make ends in one line from one process, exit status 1 (docs/errors.md); any other error
is a bug, and keeps its traceback. `app.main.main` catches the errors listed here and prints `describe(error)`."""

import inspect
import pickle
import re
import traceback
from typing import Any

import torch
from jsonargparse import ArgumentError
from lightning.fabric.utilities.exceptions import MisconfigurationException

from app.command_line.argv import value_given
from app.command_line.parser_messages import shorten
from app.command_line.speaking import TRACEBACK_VARIABLE
from app.errors import UserError
from app.run.checkpoints import unpickling_problem
from datamodules import DataError

# Mistakes in what the user asked for: reported in one line, without a traceback.
USER_ERRORS = (
    UserError,
    ArgumentError,
    DataError,
    MisconfigurationException,
    FileNotFoundError,
    pickle.UnpicklingError,
)
# The processes could not meet: a port in use, an unreachable MASTER_ADDR, a node that never came.
RENDEZVOUS_ERRORS = (torch.distributed.DistNetworkError, torch.distributed.DistStoreError)
RENDEZVOUS_HINT = (
    "Check that all --num_nodes nodes were started with the same MASTER_ADDR (an address of node 0 that every node"
    " reaches) and MASTER_PORT (free on node 0), and distinct NODE_RANKs. --trainer.strategy DDPStrategy"
    " --trainer.strategy.timeout H:MM:SS sets how long they wait for each other (default 30 minutes)."
)
# What torch, Lightning and the models raise when a value they were given is wrong.
VALUE_ERRORS = (
    ValueError,
    TypeError,
    ArithmeticError,
    AssertionError,
    IndexError,
    KeyError,
    RuntimeError,
    MisconfigurationException,
)
# Errors of this program and the parser, whose messages say already what to do.
OWN_ERRORS = (UserError, DataError, ArgumentError)
# What gloo and NCCL raise in a rank whose peer has gone: the peer's own message says why it went.
PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited")
PEER_LOST_MESSAGE = (
    "another process of the job stopped or failed, and this one lost its connection to it (its output says why;"
    " one killed, by SIGKILL or for want of memory, says nothing)."
)
# What torch's DataLoader raises when the system killed one of its workers: most often for want of memory.
WORKER_KILLED = re.compile(r"DataLoader worker \(pid.*?\) (is killed by signal|exited unexpectedly)")
WORKER_KILLED_HINT = (
    "The system may have run out of memory (its out-of-memory killer ends such processes): free memory, or give"
    " --data.num_workers a smaller value; a fit continues from its last checkpoint with --ckpt_path last."
)


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def describe(error: BaseException, argv: list[str] = ()) -> str:
    """One line: what went wrong and what to do (and how to see the traceback of an error it came from)."""
    line = _describe(error, argv)
    if isinstance(error, UserError) and error.__cause__ is not None and TRACEBACK_VARIABLE not in line:
        line = f"{line} ({TRACEBACK_VARIABLE}=1 shows the error this came from)"
    return line


def _describe(error: BaseException, argv: list[str]) -> str:
    if isinstance(error, RENDEZVOUS_ERRORS):
        return f"{one_line(error)} {RENDEZVOUS_HINT}"
    if isinstance(error, ArgumentError):
        return shorten(str(error), list(argv))
    if isinstance(error, pickle.UnpicklingError):  # Lightning loading a checkpoint from a URL, weights only
        return unpickling_problem(f"--ckpt_path {value_given(list(argv), '--ckpt_path') or ''}".strip(), error)
    return one_line(error)


def blame_option(error: BaseException, options: dict[str, Any]) -> str | None:
    """The line that ties `error` to the one option of `options` (those the user set) it is about, where the evidence
    is certain (docs/errors.md: its value, and its name or the object taking it; or its name in backquotes, as
    Lightning names an argument: "`devices` selected with `CPUAccelerator` should be an int > 0"; of several so named,
    the one whose value it shows too); else None, the error a bug."""
    message = one_line(error) or type(error).__name__
    raiser = _raising_object(error)
    suspects, shown_too = [], []
    for option, value in options.items():
        name = option.rsplit(".", 1)[-1].lstrip("-")
        valued = _value_in(value, message) or (isinstance(error, ZeroDivisionError) and _is_zero(value))
        named = re.search(rf"\b{re.escape(name)}\b", message) is not None
        if (valued and (named or _takes_argument(raiser, name, value))) or f"`{name}`" in message:
            suspects.append(option)
            shown_too += [option] if valued and named else []
    if len(suspects) > 1:  # several named ("... set `limit_val_batches` instead"): the one whose value it shows
        suspects = shown_too
    if len(suspects) != 1:
        return None
    option = suspects[0]
    kind = f" ({type(error).__name__})" if isinstance(error, ArithmeticError) else ""
    return (
        f"{option} {_shown(options[option])}: {message.rstrip('.!')}{kind}. Give {option} another value"
        f" ({TRACEBACK_VARIABLE}=1 shows where it was raised)."
    )


def _raising_object(error: BaseException) -> object | None:
    """The object whose method raised `error` (`self` of the innermost frame), or None."""
    frames = [frame for frame, _line in traceback.walk_tb(error.__traceback__)]
    return frames[-1].f_locals.get("self") if frames else None


def _takes_argument(obj: object | None, name: str, value: Any) -> bool:
    """Whether `obj`'s class takes an argument `name` (`Adam(lr=...)`), and `value` is not its default there."""
    if obj is None:
        return False
    try:
        parameter = inspect.signature(type(obj)).parameters.get(name)
    except (TypeError, ValueError):  # a class without a signature Python can read
        return False
    return parameter is not None and (parameter.default is inspect.Parameter.empty or parameter.default != value)


def options_set(config, defaults) -> dict[str, Any]:
    """The options whose parsed value differs from the parser's default, by their command-line names
    (`--model.optimizer.lr`, `--model`)."""
    default_values = dict(defaults.items(branches=False))
    chosen = {}
    for key, value in config.items(branches=False):
        if key in default_values and default_values[key] == value:
            continue
        parts = [part for part in key.split(".") if part not in ("init_args", "class_path", "dict_kwargs")]
        chosen["--" + ".".join(parts)] = value
    return chosen


def _value_in(value: Any, message: str) -> bool:
    values = value if isinstance(value, list | tuple) else [value]
    for item in values:
        if item is None or isinstance(item, bool) or str(item) == "":
            continue
        if re.search(rf"(?<![\w.-]){re.escape(str(item))}(?!\w|\.\d)", message):
            return True
    return False


def _is_zero(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


def _shown(value: Any) -> str:
    return "[" + ", ".join(map(str, value)) + "]" if isinstance(value, list | tuple) else str(value)
