"""What ``bigtrain plan`` is asked of an objective that generates before it trains (grpo's rollouts): the prompt and
completion lengths, the completions per prompt and the KL term, from the arguments, else the recipe, else TRL's
defaults; the rows it then trains on (prompt + completion), the roles the train section gives it (a reference with a
KL term) and the global batch in whole groups."""

from __future__ import annotations

import dataclasses
from typing import Any

from bigtrain.config.load import MINIMUMS as RECIPE_MINIMUMS
from bigtrain.config.schema import TrainConfig
from bigtrain.config.workload import Generation
from bigtrain.errors import ConfigError

# the arguments, and the train keys they stand for
ASKED = {"completion_length": "max_completion_length", "num_generations": "num_generations", "beta": "beta"}
# their least values: the recipe keys' (config/load.MINIMUMS), and a group of two to compare (grpo's own check)
MINIMUMS = {
    "prompt_length": RECIPE_MINIMUMS["data.max_prompt_length"],
    "completion_length": RECIPE_MINIMUMS["train.max_completion_length"],
    "beta": RECIPE_MINIMUMS["train.beta"],
    "num_generations": 2,
}


@dataclasses.dataclass(frozen=True)
class RolloutAsk:
    """The job (its roles as the train section decides them), the rows' length and what each step generates."""

    job: Any
    seq_len: int | None
    generation: Generation | None


def rollout_of(job: Any, cfg: Any, asked: dict[str, Any] | None, seq_len: int | None, spell: Any) -> RolloutAsk:
    """The job's rollout as asked (module docstring); a ConfigError naming the argument for what does not fit."""
    given = {k: v for k, v in (asked or {}).items() if v is not None}
    spec = job.objective
    if spec.generation is None:
        if given:
            name = next(iter(given))
            raise ConfigError(
                f"{spell(name)} is for objectives that generate their completions (grpo); "
                f"train.objective={spec.name} reads its rows from data"
            )
        return RolloutAsk(job, seq_len, None)
    if seq_len is not None:
        raise ConfigError(
            f"{spell.value('seq_len', seq_len)}: a {spec.name} row is its prompt and its completion; give "
            f"{spell('prompt_length')} and {spell('completion_length')} instead"
        )
    for name, value in given.items():
        if value < MINIMUMS[name]:
            raise ConfigError(f"{spell.value(name, value)} must be at least {MINIMUMS[name]}")
    train = cfg.train if cfg is not None else TrainConfig(objective=spec.name)
    train = dataclasses.replace(train, **{ASKED[k]: v for k, v in given.items() if k in ASKED})
    prompt = given.get("prompt_length") or (cfg.data.max_prompt_length if cfg is not None else None)
    generation = spec.generation(train, prompt)
    roles = spec.roles_of(train) if spec.roles_of is not None else job.roles
    job = dataclasses.replace(job, roles=roles)
    return RolloutAsk(job, generation.prompt_len + generation.completion_len, generation)


def whole_groups(sizes: dict[str, Any], generation: Generation | None, asked: int | None, spell: Any) -> dict[str, Any]:
    """The task's sizes with a global batch of whole groups: a default one rounded up to a multiple of the
    completions per prompt; one asked for that is not is refused, as ``bigtrain train`` refuses it."""
    if generation is None or sizes["global_batch_size"] % generation.num_generations == 0:
        return sizes
    g, batch = generation.num_generations, sizes["global_batch_size"]
    if asked is None:
        return {**sizes, "global_batch_size": batch + g - batch % g}
    raise ConfigError(
        f"{spell.value('num_generations', g)} does not divide {spell.value('global_batch_size', batch)} "
        f"(completions per step: whole groups); use a global batch of {batch + g - batch % g}"
    )
