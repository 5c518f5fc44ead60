"""Recipe schema and loading (YAML + overrides -> typed config)."""

from bigtrain.config.load import load_recipe
from bigtrain.config.schema import DataConfig, ModelConfig, ParallelConfig, RecipeConfig, TrainConfig

__all__ = ["DataConfig", "ModelConfig", "ParallelConfig", "RecipeConfig", "TrainConfig", "load_recipe"]
