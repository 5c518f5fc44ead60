"""``train.objective: grpo``: online RL with the GRPO family's loss (Shao et al. 2024; DAPO, Dr. GRPO, GSPO as TRL 1.16
names them). Each step's micro-batches are made during training (``roles/rollout.py``): the policy generates
``num_generations`` completions per prompt, the reward functions score them, and the group-relative advantages
weight the clipped surrogate loss (``losses/grpo.py``), with a KL penalty to the reference model where beta > 0
(the reference is the role dpo's is: ``parallel.reference``). TRL's parameter names and meanings throughout."""

from __future__ import annotations

from typing import Any

from bigtrain.config.capabilities.reference import REFERENCE, ROLE
from bigtrain.config.capabilities.replica_sync import settings_of
from bigtrain.config.capabilities.table import row, split_settings
from bigtrain.config.online_rl import GRPO_LOSSES
from bigtrain.config.setup import TOKEN_ROWS, Setup
from bigtrain.errors import ConfigError
from bigtrain.objectives.spec import ObjectiveSpec

LOSS = GRPO_LOSSES[2]  # TRL 1.16's default loss_type: dapo
DEFAULT_PROMPT_LENGTH = 512  # TRL's GRPOConfig max_prompt_length: the planner's prompts where none is said
KL_BETA = 0.04  # a KL term's weight where only its presence matters (the simulator's job with a reference)
KEYS = (
    *(f"train.{k}" for k in ("beta", "loss_type", "num_generations", "max_completion_length", "epsilon")),
    *(f"train.{k}" for k in ("epsilon_high", "num_iterations", "importance_sampling_level", "scale_rewards")),
    *(f"train.{k}" for k in ("temperature", "top_p", "top_k", "reward_functions", "reward_weights")),
    "data.max_prompt_length",
    "rollout.engine",
    "rollout.replay",
    "rollout.async",
    "rollout.seed",
    "rollout.completions_every",
    "parallel.reference",
)


def generation(train: Any, prompt_len: int | None) -> Any:
    """What each step generates: the global batch's completions of at most train.max_completion_length tokens
    after prompts of ``prompt_len`` (None: TRL's max_prompt_length default), with the reward models' saved weights."""
    from bigtrain.config.workload import Generation
    from bigtrain.roles.rewards import reward_model_bytes

    return Generation(
        prompt_len or DEFAULT_PROMPT_LENGTH,
        train.max_completion_length,
        train.num_generations,
        train.num_iterations,
        reward_model_bytes(list(train.reward_functions or [])),
    )


def beta_of(train: Any) -> float:
    """train.beta, or TRL's GRPOConfig default (0: no KL, no reference) where it is unset."""
    return 0.0 if train.beta is None else train.beta


def settings(train: Any) -> Any:
    from bigtrain.losses.grpo import GrpoSettings

    return GrpoSettings(
        beta=beta_of(train),
        epsilon_low=train.epsilon,
        epsilon_high=train.epsilon if train.epsilon_high is None else train.epsilon_high,
        loss_type=train.loss_type or LOSS,
        sequence_level=train.importance_sampling_level == "sequence",
        max_completion_length=train.max_completion_length,
        temperature=train.temperature,
    )


def make(built: Any, train: Any) -> Any:
    from bigtrain.losses.grpo import Grpo

    return Grpo(settings(train))


def _check_numbers(train: Any) -> None:
    b, g = train.global_batch_size, train.num_generations
    if g < 2:
        raise ConfigError(
            f"train.num_generations={g}: a group needs at least 2 completions to compare (advantages are relative to "
            "the group); use e.g. 8"
        )
    if b % g:
        fits = [n for n in range(2, min(b, 64) + 1) if b % n == 0]
        raise ConfigError(
            f"train.num_generations={g} does not divide train.global_batch_size={b} (completions per step: whole "
            f"groups); use num_generations {', '.join(map(str, fits[:6]))}, or a global batch of {b + g - b % g}"
        )
    if train.loss_type is not None and train.loss_type not in GRPO_LOSSES:
        raise ConfigError(
            f"train.loss_type={train.loss_type} is dpo's; train.objective=grpo takes {', '.join(GRPO_LOSSES)} "
            f"(unset: {LOSS}, TRL's default)"
        )
    # the counts' and clip ranges' minimums are the loader's (config/load.MINIMUMS), as train.beta's
    if train.temperature <= 0:
        raise ConfigError(f"train.temperature={train.temperature} must be above 0 (sampling); e.g. 1.0")
    if not 0 < train.top_p <= 1:
        raise ConfigError(f"train.top_p={train.top_p} must be in (0, 1]; 1 keeps every token")


def _check_rewards(train: Any) -> None:
    from bigtrain.roles.rewards import load_reward_functions

    if not train.reward_functions:
        raise ConfigError(
            "train.objective=grpo needs train.reward_functions: a list of module:function (TRL's signature "
            "f(prompts, completions, completion_ids, **fields) -> list of floats)"
        )
    weights = train.reward_weights
    if weights is not None and len(weights) != len(train.reward_functions):
        raise ConfigError(
            f"train.reward_weights has {len(weights)} values for {len(train.reward_functions)} reward functions; "
            "give one per function, or unset it (1 each)"
        )
    load_reward_functions(train.reward_functions)


def _check_rollout(cfg: Any) -> None:
    rollout = cfg.rollout
    if rollout.engine == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                "rollout.engine=vllm: vLLM is not installed here (pip install vllm); use rollout.engine=hf"
            )
        raise ConfigError("rollout.engine=vllm is not built yet; use rollout.engine=hf (generate on the policy)")
    if rollout.off_policy:
        raise ConfigError(f"rollout.async={rollout.off_policy} (off-policy rollouts) is not built yet; use 0")
    asked = cfg.parallel.options.get(REFERENCE.name, REFERENCE.default)
    if beta_of(cfg.train) == 0 and asked != REFERENCE.default:
        raise ConfigError(
            f"parallel.reference={asked} with train.beta=0: grpo then has no KL term and loads no reference; set "
            "train.beta (e.g. 0.04) or leave parallel.reference=auto"
        )
    if rollout.replay is not None:
        from pathlib import Path

        if not Path(rollout.replay).is_file():
            raise ConfigError(f"rollout.replay={rollout.replay!r} is not a file; give a JSON-lines file of completions")


def check(cfg: Any) -> None:
    from bigtrain.roles.reference import check_reference

    _check_numbers(cfg.train)
    _check_rollout(cfg)
    _check_rewards(cfg.train)
    if beta_of(cfg.train) > 0:
        check_reference(cfg)


def read_data(cfg: Any, hf_config: Any) -> tuple[Any, Any]:
    from bigtrain.data.prompts import read_prompts

    prompts = read_prompts(cfg, cfg.train.max_completion_length, cfg.train.num_generations)
    if prompts.vocab_size > hf_config.vocab_size:
        raise ConfigError(
            f"data.tokenizer has {prompts.vocab_size} ids and the model's vocabulary {hf_config.vocab_size}; use the "
            "model's own tokenizer"
        )
    return prompts, None


def synthetic(hf_config: Any, plan: Any, workload: Any, device: Any) -> Any:
    """A micro-batch as the rollouts make it: m rows of the workload's length, the second half a completion."""
    import torch

    from bigtrain.data.labels import IGNORE_INDEX, next_token_labels
    from bigtrain.data.rollout_batch import RolloutBatch

    rows, length = plan.micro_batch_size, workload.seq_len
    ids = torch.randint(0, hf_config.vocab_size, (rows, length), device=device)
    labels = next_token_labels(ids)
    labels[:, : length // 2] = IGNORE_INDEX
    logps = torch.zeros(rows, length, device=device)
    return RolloutBatch(ids, labels, torch.ones(rows, device=device), 1.0, logps, logps)


def count(batch: Any, workload: Any, plan: Any) -> float:
    """A global batch counts its completions (the simulator's normaliser; the loss's own depends on loss_type)."""
    return float(workload.global_batch_size)


def attach(engine: Any, options: Any, train: Any) -> None:
    """The reference, where the KL term needs it (beta > 0)."""
    if beta_of(train) > 0:
        from bigtrain.roles.reference import attach_reference

        attach_reference(engine, options, train)


def reward_layout(plan: Any, engine: Any) -> Any:
    """Reward models laid out as the policy: sharded over its FSDP2 mesh, partitioned under its DeepSpeed ZeRO-3
    config, else whole on every rank (DDP, ZeRO-1/2: the planner's ``reward_model_share``)."""
    from bigtrain.roles.rewards import WHOLE, Layout

    if plan.backend == "fsdp2":
        return Layout(mesh=engine.built.mesh.fsdp_mesh)
    if plan.backend == "deepspeed" and plan.zero_stage == 3:
        return Layout(deepspeed_config=engine.config)
    return WHOLE


def step_source(cfg: Any, plan: Any, engine: Any, data: Any, device: Any, resumed: str | None) -> Any:
    """The rollouts that make each step's micro-batches (``roles/rollout.py``)."""
    from bigtrain.data.order import GlobalOrder
    from bigtrain.roles.rewards import load_reward_functions
    from bigtrain.roles.rollout import Rollouts, RolloutSettings

    train, rollout = cfg.train, cfg.rollout
    functions = load_reward_functions(train.reward_functions, device, reward_layout(plan, engine))
    weights = tuple(train.reward_weights or [1.0] * len(functions))
    s = RolloutSettings(
        num_generations=train.num_generations,
        num_iterations=train.num_iterations,
        max_completion_length=train.max_completion_length,
        temperature=train.temperature,
        top_p=train.top_p,
        top_k=train.top_k,
        scale_rewards=train.scale_rewards,
        weights=weights,
        seed=train.seed if rollout.seed is None else rollout.seed,
        replay=rollout.replay,
        completions_every=rollout.completions_every,
        output_dir=cfg.output_dir,
    )
    order = GlobalOrder(data.num_rows, train.global_batch_size // train.num_generations, cfg.data.shuffle, train.seed)
    return Rollouts(engine, data, functions, s, order, plan.micro_batch_size, device, resumed)


def online_rl_with_model_parallelism(s: Setup) -> str | None:
    """Rollouts generate with the whole model on each data-parallel rank: what splits a row, the vocabulary or the
    layers, and replica groups that train apart, are not built with it."""
    assert s.job is not None
    for key, value, default in (*split_settings(s.plan), ("sync", settings_of(s.plan).mode, "every_step")):
        if value != default:
            return (
                f"parallel.{key}={str(value).lower()} with train.objective={s.job.objective} is not built yet "
                f"(rollouts generate with the whole model on each data-parallel rank); set parallel.{key}="
                f"{str(default).lower()} and shard with FSDP2 or ZeRO-3"
            )
    return None


def precomputed_reference(s: Setup) -> str | None:
    """The completions exist only once generated: no pass over the data can score them before training."""
    if REFERENCE.of(s.plan) != "precomputed":
        return None
    return (
        "parallel.reference=precomputed with train.objective=grpo: the completions are generated during training, so "
        "no pass before it can score them; use parallel.reference=sharded, offloaded or adapter_disabled (LoRA)"
    )


OBJECTIVE = ObjectiveSpec(
    name="grpo",
    summary="online RL: completions generated by the policy, scored by reward functions, group-relative advantages",
    reads=TOKEN_ROWS,
    make=make,
    roles=(ROLE,),  # the roles it may have (the docs' and the capability pairs' view); roles_of decides per recipe
    roles_of=lambda train: (ROLE,) if beta_of(train) > 0 else (),
    train_of_roles=lambda roles: {"beta": KL_BETA} if ROLE in roles else {},
    generation=generation,
    read_data=read_data,
    synthetic=synthetic,
    count=count,
    check=check,
    attach=attach,
    step_source=step_source,
    keys=KEYS,
    rules=(
        row(online_rl_with_model_parallelism, "not_built", reads_job=True),
        row(precomputed_reference, "not_built", reads_job=True),
    ),
    example_train=(("reward_functions", ["bigtrain.rewards:exact_answer"]),),
    batch_noun="completions",
    shown=("reward", "kl"),
    refusal=lambda task: (
        f"train.objective=grpo trains the log-probabilities of generated completions, which a {task} model does not "
        "give; use a causal LM"
    ),
)
