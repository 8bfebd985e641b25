"""The megakernel's checks (see the package docstring): validator, simulator, twins, audit, statistics."""
