"""Checkpoint I/O: safetensors by HF tensor name, synthetic checkpoints, quantised formats."""
