"""train.py's command line before LightningCLI sees it: the `--devices`/`--num_nodes` shortcuts, and `fit` put in
front when no subcommand is named (the program then fits and tests)."""

from lightning.pytorch.cli import LightningCLI

SUBCOMMANDS = tuple(LightningCLI.subcommands())  # fit, validate, test, predict
SHORTCUTS = {"--devices": "--trainer.devices", "--num_nodes": "--trainer.num_nodes"}


def parse_command(argv: list[str]) -> tuple[list[str], bool]:
    """`train.py`'s command line as LightningCLI arguments (shortcuts expanded, `fit` put in front when no
    subcommand is named), and whether to test after fitting."""
    args, shortcuts = [], []
    tokens = iter(argv)
    for token in tokens:
        name, has_value, value = token.partition("=")
        if name in SHORTCUTS:
            shortcuts.append(f"{SHORTCUTS[name]}={value if has_value else next(tokens, '')}")
        else:
            args.append(token)
    test_after_fit = subcommand_of(args) is None and args[:1] not in (["-h"], ["--help"])
    if test_after_fit:
        args.insert(0, "fit")
    return args + shortcuts, test_after_fit


def subcommand_of(args: list[str]) -> str | None:
    """The subcommand `args` name where LightningCLI takes one (first, or after `--config FILE`), or None."""
    tokens = iter(args)
    for token in tokens:
        if token in ("-c", "--config"):
            next(tokens, None)
        elif not token.startswith(("--config=", "--print_config")):
            return token if token in SUBCOMMANDS else None
    return None


def values_given(args: list[str], option: str) -> list[str]:
    """Every value of `option` on the command line (`--opt VALUE` or `--opt=VALUE`), in order."""
    values = []
    for index, token in enumerate(args):
        name, has_value, text = token.partition("=")
        if name == option and (has_value or index + 1 < len(args)):
            values.append(text if has_value else args[index + 1])
    return values


def value_given(args: list[str], option: str) -> str | None:
    """The value of a plain option such as `--ckpt_path`: given twice, the last one, which the parser takes; None
    where it is not given."""
    values = values_given(args, option)
    return values[-1] if values else None
