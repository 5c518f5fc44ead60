"""Plans: what parallel layout a job uses (and, later, how the planner chooses one)."""

from bigtrain.plan.plan import Plan, resolve_plan

__all__ = ["Plan", "resolve_plan"]
