"""``train.objective: sft``: next-token cross-entropy summed over the labelled tokens of token rows, normalised by the
labelled tokens of the whole global batch (``losses/causal_lm.py``: whole, compiled or chunked as the transforms left
the model), plus a mixture's router loss where its config asks for it. The objective of causal LMs and
vision-language models."""

from __future__ import annotations

from typing import Any

from bigtrain.config.setup import TOKEN_ROWS
from bigtrain.errors import ConfigError
from bigtrain.objectives.spec import ObjectiveSpec


def make(built: Any, train: Any) -> Any:
    from bigtrain.losses.causal_lm import CausalLM, router_loss_coef

    return CausalLM(
        head=built.loss_head,
        chunk_tokens=built.plan.loss_chunk_tokens,
        autocast=built.autocast_dtype,
        compiled=built.compile_loss,
        router_weight=router_loss_coef(built.parts[0].config),
    )


def check(cfg: Any) -> None:
    if cfg.train.label_smoothing:
        raise ConfigError(
            f"train.label_smoothing={cfg.train.label_smoothing} applies to classifiers; a causal LM's loss has "
            "none: set train.label_smoothing=0"
        )


OBJECTIVE = ObjectiveSpec(
    name="sft",
    summary="next-token cross-entropy on the labelled tokens (pre-training, supervised fine-tuning)",
    reads=TOKEN_ROWS,
    make=make,
    check=check,
    refusal=lambda task: (
        f"train.objective=sft trains token rows, which a {task} model does not give; leave train.objective=auto "
        "(its own loss)"
    ),
)
