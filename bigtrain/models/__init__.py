"""Building HF models on meta and giving them values."""
