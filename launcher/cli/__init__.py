"""The command line: the click group, one module per command, shared options."""
