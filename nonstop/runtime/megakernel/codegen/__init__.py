"""The megakernel's code generator: ``record`` -> ``plan`` -> ``source`` (see the package docstring)."""
