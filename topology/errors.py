"""The one error type for unusable input: the CLI prints its message as one line, exit 2."""


class InputError(Exception):
    """Bad input (a file, flag, host or model): the message says what to do."""

    exit_code = 2
