"""Reference layers in plain PyTorch: the math of every layer type, once.

Each file holds functional forms (pure functions on tensors, with shapes and equations in their
docstrings) and the nn.Module that owns the weights and calls them. Everything else in nonstop -
super-op references, Triton kernels' tests, the megakernel - is checked against these functions.
"""
