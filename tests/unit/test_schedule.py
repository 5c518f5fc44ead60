import pytest

from bigtrain.config.schema import TrainConfig
from bigtrain.engine.loss_scale import DynamicLossScaler
from bigtrain.train.optim import lr_factor


def test_constant_with_warmup():
    cfg = TrainConfig(steps=10, warmup_steps=4, lr_schedule="constant")
    assert [lr_factor(s, cfg) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_goes_from_peak_to_floor():
    cfg = TrainConfig(steps=11, warmup_steps=1, lr_schedule="cosine", min_lr_ratio=0.1)
    factors = [lr_factor(s, cfg) for s in range(11)]
    assert factors[1] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(factors[1:-1], factors[2:], strict=True))


def test_loss_scaler_halves_on_overflow_and_grows_after_clean_steps():
    s = DynamicLossScaler(1024.0, growth_interval=3)
    s.update(finite=False)
    assert s.scale == 512.0
    for _ in range(3):
        s.update(finite=True)
    assert s.scale == 1024.0
