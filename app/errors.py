"""The error of a mistake the user can fix, importing nothing of the project so that every folder can raise it."""


class UserError(Exception):
    """Something the user asked for cannot be done; the message says what and how to fix it."""
