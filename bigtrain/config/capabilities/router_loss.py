"""The router's load-balancing loss of a mixture (the model config's ``output_router_logits``), added to the loss."""

from __future__ import annotations

from bigtrain.config.capabilities.table import Capability, row
from bigtrain.config.setup import Setup


def router_loss_with_pp_or_cp(s: Setup) -> str | None:
    if s.model is None or not s.model.router_loss or (s.plan.pp == 1 and s.plan.cp == 1):
        return None
    other = f"parallel.pp={s.plan.pp}" if s.plan.pp > 1 else f"parallel.cp={s.plan.cp}"
    return (
        f"{other} with the router's load-balancing loss of {s.model.model_type} (output_router_logits) is not built "
        "yet: a stage or a slice of a row would see only part of each forward's routing; set "
        "output_router_logits=false in the model config or that degree to 1"
    )


CAPABILITY = Capability(
    name="router_loss",
    # a mean over a forward's tokens, padding included, as transformers computes it: a cut would change it
    one_length=lambda plan, train, hf_config: bool(getattr(hf_config, "output_router_logits", False)),
    summary="the router's load-balancing loss of a mixture of experts (output_router_logits)",
    keys=("model.config.output_router_logits",),
    rules=(row(router_loss_with_pp_or_cp, "not_built", reads_model=True),),
)
