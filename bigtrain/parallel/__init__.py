"""Applying a plan to a model: mesh, FSDP2, DDP, activation checkpointing."""
