"""Errors a user can act on: each names the tensor and the file."""


class CheckpointError(Exception):
    """A checkpoint that cannot be loaded as the config describes it."""
