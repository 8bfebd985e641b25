"""Training-side tools: corpus preparation and tokenizer training."""
