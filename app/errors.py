"""The error of a mistake the user can fix. Here, importing nothing of the project, so that every folder of `app/`
raises it without importing another (`app.command_line.errors` says how each mistake is told)."""


class UserError(Exception):
    """Something the user asked for cannot be done; the message says what and how to fix it."""
