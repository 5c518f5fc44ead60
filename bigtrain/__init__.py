"""bigtrain: one trainer for sharded, tensor- and pipeline-parallel training of HuggingFace causal LMs."""

__version__ = "0.1.0"
