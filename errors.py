"""UserError: what the project raises when it stops for a reason the user can act on: a bad flag, a foreign
folder, a file it cannot read, a full disk, a download that failed, a rank that stopped answering.

Every entry point prints a UserError as one line, `error: ...`, which names the input and what to do; any other
exception is a bug, and keeps its traceback so that someone can find where it came from. A subclass of
ValueError, so that code and tests expecting a ValueError for bad input still hold.
"""


class UserError(ValueError):
    """A stop meant for the user: the message names the input (a flag, a file) and what to do instead."""
