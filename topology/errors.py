"""The one error type for unusable input: the CLI prints its message as one line, exit 2."""

from __future__ import annotations

import re

MAX_MESSAGE = 1000  # a message quotes values; a hostile value must not make it megabytes
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]")


def one_line(message: str, limit: int = MAX_MESSAGE) -> str:
    """`message` with control characters (newlines too) escaped, cut to `limit` characters."""
    message = _CONTROL.sub(lambda m: ascii(m.group())[1:-1], message[: limit * 2])
    return message if len(message) <= limit else message[: limit - 1] + "…"


class InputError(Exception):
    """Bad input (a file, flag, host or model): the message says what to do.

    The message is made one line here, whatever a path or value quoted in it holds, so the
    promise "one line on stderr" holds for every raiser.
    """

    exit_code = 2

    def __init__(self, message: str = "") -> None:
        super().__init__(one_line(str(message)))
