"""The CLI's commands, one module per area; `cli.py` assembles them into one app."""
