"""The one exception a published row raises when the model cannot express it."""


class Uncovered(Exception):
    """A row the model cannot express; the message is the coverage reason."""
