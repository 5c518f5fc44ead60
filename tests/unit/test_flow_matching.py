"""Flow matching as diffusers trains FLUX and SD3 (``losses/flow_matching.py``) against diffusers' own functions: the
timestep densities, the scheduler's sigmas (SD3's shift of 3, FLUX's unshifted training sigmas), the loss weighting,
FLUX's latent packing and position ids; and each example's draws keyed by its global position, not by where it is
computed."""

from __future__ import annotations

import pytest
import torch

from bigtrain.data.noising import FlowMatching, draw_u, example_generator, image_ids, noised, pack, sigma_of, unpack
from bigtrain.losses.flow_matching import per_example_losses, weighting

diffusers = pytest.importorskip("diffusers")


@pytest.mark.parametrize("scheme", ["none", "logit_normal", "mode"])
def test_one_draw_is_diffusers_density_for_one_example(scheme):
    from diffusers.training_utils import compute_density_for_timestep_sampling

    fm = FlowMatching(weighting_scheme=scheme, logit_mean=0.3, logit_std=1.2, mode_scale=1.29)
    theirs = compute_density_for_timestep_sampling(
        scheme, 1, logit_mean=0.3, logit_std=1.2, mode_scale=1.29, generator=torch.Generator().manual_seed(5)
    )
    assert draw_u(fm, torch.Generator().manual_seed(5)) == pytest.approx(float(theirs[0]), abs=1e-7)


@pytest.mark.parametrize("shift,dynamic", [(3.0, False), (1.0, False), (3.0, True)], ids=["sd3", "plain", "flux"])
def test_sigmas_are_the_scheduler_s_at_its_index(shift, dynamic):
    """The training scripts' get_sigmas: the scheduler's sigma at index (u N).long(); FLUX's schedulers shift at
    inference only (dynamic shifting), so its training sigmas are unshifted."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift, use_dynamic_shifting=dynamic)
    fm = FlowMatching(shift=1.0 if dynamic else shift)
    for u in (0.0, 0.0004, 0.25, 0.5, 0.7311, 0.9999):
        index = int(u * 1000)
        assert sigma_of(fm, u) == pytest.approx(float(scheduler.sigmas[index]), abs=1e-6)
        assert sigma_of(fm, u) * 1000 == pytest.approx(float(scheduler.timesteps[index]), abs=1e-3)


@pytest.mark.parametrize("scheme", ["none", "sigma_sqrt", "cosmap"])
def test_the_weighting_is_diffusers(scheme):
    from diffusers.training_utils import compute_loss_weighting_for_sd3

    sigmas = torch.tensor([0.05, 0.3, 0.9, 1.0])
    torch.testing.assert_close(weighting(FlowMatching(scheme), sigmas), compute_loss_weighting_for_sd3(scheme, sigmas))


def test_packing_and_ids_are_flux_pipeline_s():
    from diffusers import FluxPipeline

    latents = torch.randn(2, 16, 8, 6)
    packed = FluxPipeline._pack_latents(latents, 2, 16, 8, 6)
    torch.testing.assert_close(pack(latents), packed, rtol=0, atol=0)
    torch.testing.assert_close(unpack(packed, 8, 6), latents, rtol=0, atol=0)
    torch.testing.assert_close(image_ids(8, 6), FluxPipeline._prepare_latent_image_ids(2, 4, 3, "cpu", torch.float32))


def test_the_noisy_input_target_and_loss_follow_the_script():
    fm = FlowMatching("sigma_sqrt")
    x, e = torch.randn(3, 4, 2, 2), torch.randn(3, 4, 2, 2)
    sigmas = torch.tensor([0.2, 0.5, 0.9])
    noisy, target = noised(x, e, sigmas)
    torch.testing.assert_close(noisy[1], 0.5 * x[1] + 0.5 * e[1])
    torch.testing.assert_close(target, e - x)
    pred = torch.randn_like(x)
    expected = torch.stack([((pred[i] - target[i]) ** 2).mean() / sigmas[i] ** 2 for i in range(3)])
    torch.testing.assert_close(per_example_losses(fm, pred, target, sigmas), expected)


def test_an_example_s_draws_depend_on_its_global_position_only():
    first = example_generator(0, 17)
    a = (torch.rand(1, generator=first), torch.randn(4, generator=first))
    second = example_generator(0, 17)
    b = (torch.rand(1, generator=second), torch.randn(4, generator=second))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], torch.rand(1, generator=example_generator(0, 18)))
    assert not torch.equal(a[0], torch.rand(1, generator=example_generator(1, 17)))


def test_preconditioned_outputs_are_sd3_script_s_loss():
    """train_dreambooth_sd3.py with --precondition_outputs: model_pred * (-sigmas) + noisy against the clean latents."""
    from types import SimpleNamespace

    from bigtrain.losses.flow_matching import FlowMatchingLoss

    torch.manual_seed(0)
    x, e, prediction = torch.randn(3, 4, 6, 6), torch.randn(3, 4, 6, 6), torch.randn(3, 4, 6, 6)
    sigmas = torch.tensor([0.2, 0.5, 0.9])
    noisy, _ = noised(x, e, sigmas)
    batch = SimpleNamespace(inputs={"hidden_states": noisy}, target=x, sigmas=sigmas, labels=torch.zeros(3),
                            preconditioned=True)  # fmt: skip
    s = sigmas.view(-1, 1, 1, 1)
    script = torch.mean(((prediction * (-s) + noisy - x) ** 2).reshape(3, -1), 1).sum()
    got = FlowMatchingLoss(FlowMatching("logit_normal")).loss_sum(prediction, batch)
    torch.testing.assert_close(got, script)


def test_each_family_draws_by_its_script_s_scheme_unless_the_recipe_names_one():
    from types import SimpleNamespace

    from bigtrain.data.noising import flow_of

    train = SimpleNamespace(weighting_scheme=None, logit_mean=0.0, logit_std=1.0, mode_scale=1.29)
    assert flow_of(train).weighting_scheme == "none"
    assert flow_of(train, 3.0, "logit_normal").weighting_scheme == "logit_normal"
    named = SimpleNamespace(**{**vars(train), "weighting_scheme": "cosmap"})
    assert flow_of(named, 3.0, "logit_normal").weighting_scheme == "cosmap"


def test_an_sd3_image_its_position_embedding_does_not_cover_is_one_line():
    from bigtrain.errors import ConfigError
    from bigtrain.tasks.text_to_image import check_positions

    sd35 = {"pos_embed_max_size": 96, "patch_size": 2}
    check_positions(sd35, 1536, 4)  # 192 latents, 96 patches a side: the most it covers
    with pytest.raises(ConfigError, match=r"images of 2048 px are 128 patches a side.*at most 1536 px"):
        check_positions(sd35, 2048, 4)
    with pytest.raises(ConfigError, match=r"the longest bucket side, 1600 px, is 100 patches a side"):
        check_positions(sd35, 1600, 4, bucketed=True)
