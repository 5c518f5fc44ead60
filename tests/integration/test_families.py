"""A family whose checkpoints transformers converts at load time trains from its real ``save_pretrained`` folder and
exports back to it: Mixtral (per-expert tensors on disk, fused in the model).
FSDP2 on 2 gloo ranks shards the fused expert tensors; the final HF folder has the source's own keys, loads with
``from_pretrained`` with nothing missing or unexpected, and holds exactly the trained parameters."""

from __future__ import annotations

import pytest
import torch
from cases import CONVERTED_FAMILIES
from helpers import REPO, learnable_rows, recipe_dict, run_torchrun, save_rows, save_tiny_model, write_recipe
from safetensors import safe_open

pytestmark = pytest.mark.full  # the full tier (python -m pytest -m full; docs/testing.md)

WORKER = REPO / "tests" / "distributed" / "train_and_save.py"


# Mixtral: its fused experts are the conversion that reshapes; GPT-NeoX's rename is checked both ways on one process
# (tests/unit/test_checkpoint_keys.py) and trains from its folder in test_equivalence.py
@pytest.mark.parametrize("family", ["mixtral"])
def test_a_converted_family_trains_from_its_folder_and_exports_to_its_format(family, tmp_path):
    from transformers import AutoModelForCausalLM

    source = save_tiny_model(tmp_path / "source", spec=CONVERTED_FAMILIES[family])
    save_rows(tmp_path / "rows.npy", learnable_rows(16, 17, vocab=128))
    recipe = recipe_dict(
        tmp_path / "out",
        tmp_path / "rows.npy",
        source,
        train={"steps": 3, "global_batch_size": 4, "lr": 1e-3},
        parallel={"backend": "fsdp2", "micro_batch_size": 1},  # dp_shard 2, accumulation 2
    )
    write_recipe(tmp_path / "recipe.yaml", recipe)
    proc = run_torchrun([str(WORKER), str(tmp_path / "recipe.yaml"), str(tmp_path / "params.pt")], module=False)
    assert proc.returncode == 0, proc.stderr[-3000:]

    exported = tmp_path / "out" / "model"
    with safe_open(str(source / "model.safetensors"), "pt") as before, safe_open(
        str(exported / "model.safetensors"), "pt"
    ) as after:
        assert set(after.keys()) == set(before.keys())  # the family's own format, not the model's names
    model, info = AutoModelForCausalLM.from_pretrained(exported, output_loading_info=True)
    assert not any(info.values()), info
    trained = torch.load(tmp_path / "params.pt")
    loaded = dict(model.named_parameters())
    assert set(trained) == set(loaded)
    for name, value in trained.items():
        assert torch.equal(loaded[name].detach(), value), name
    original = AutoModelForCausalLM.from_pretrained(source).state_dict()
    assert not all(torch.equal(original[n], v) for n, v in trained.items())  # training moved them
