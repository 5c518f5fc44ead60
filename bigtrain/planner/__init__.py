"""The planner: pure functions from model statistics and hardware to a ranked, explained choice of plan.

Imports neither ``torch.distributed`` nor the trainer (tests/unit/test_layering.py checks it): every rank of a job,
and ``bigtrain plan`` on a laptop, computes the same answer from the same numbers.
"""
