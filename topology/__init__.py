"""Pure topology: command outputs -> host facts -> link graph -> problems -> plan.

No subprocess, no network, no MLX import: everything here is a function of its arguments.
"""
