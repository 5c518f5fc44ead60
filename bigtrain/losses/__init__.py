"""What a training step minimises, given a micro-batch and the model's output: one objective per task.

An objective (``base.Objective``) returns its loss *sum* over what it counts (labelled tokens for a causal LM), the
count itself (summed over the global batch by the loop, which scales every micro-batch's sum by 1 / that total), and
a term averaged over every forward of the global batch where it has one (a mixture's router loss). The engines
drive any objective the same way and never learn which one runs; classification over examples and the preference
objectives over pairs are objectives here too.
"""

from bigtrain.losses.base import Objective, Terms
from bigtrain.losses.causal_lm import CausalLM
from bigtrain.losses.classification import Classification
from bigtrain.losses.preference import Preference, PreferenceSettings

__all__ = ["CausalLM", "Classification", "Objective", "Preference", "PreferenceSettings", "Terms"]
