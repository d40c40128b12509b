"""UserError: what the project raises when it refuses an input (a bad flag, a foreign folder, a file it cannot read).

Every entry point prints a UserError as one line, `error: ...`, which names the input and what to do; any other
exception is a bug, and keeps its traceback so that someone can find where it came from. A subclass of
ValueError, so that code and tests expecting a ValueError for bad input still hold.
"""


class UserError(ValueError):
    """A refusal meant for the user: the message names the input (a flag, a file) and what to do instead."""
