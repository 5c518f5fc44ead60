"""The embedding model's planner (``planner/embedding_plan.py``): the presets' sizes, what fits where the issue's users
hit walls (a 7 B embedder trained fully does not fit an 80 GB GPU, sentence-transformers #2802; with LoRA it does),
and the gradient cache's trade: several micro-batches per rank cost a third more compute and the cached gradients,
one micro-batch of the rank's whole share neither."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from classifier_memory import classifier_plan  # noqa: E402

from bigtrain.config.workload import Workload  # noqa: E402
from bigtrain.job import job_facts  # noqa: E402
from bigtrain.planner.embedding_plan import as_texts  # noqa: E402
from bigtrain.planner.hardware import make_cluster  # noqa: E402
from bigtrain.planner.model_stats import load_model_config  # noqa: E402
from bigtrain.tasks import task  # noqa: E402

# the model cards' counts of the base models (e5-mistral-7b-instruct: Mistral-7B without its LM head)
PUBLISHED = {"e5-mistral-7b": 7.11e9, "modernbert-large": 395e6}


def _planned(preset: str, workload: Workload):
    return task("embedding").planner(load_model_config(preset), workload)


def _workload(batch: int = 64, method: str = "full") -> Workload:
    job = job_facts("contrastive", "embedding")
    return Workload(seq_len=512, global_batch_size=batch, method=method, mixed_precision="bf16", job=job)


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_the_presets_base_models_have_their_published_size(preset):
    assert _planned(preset, _workload()).params == pytest.approx(PUBLISHED[preset], rel=0.01)


def test_the_docs_commands_a_7b_embedder_fits_one_80gb_gpu_with_lora_and_not_trained_fully(cli_in_process):
    """docs/embedding.md's two bigtrain plan commands, as written."""
    from helpers import docs_commands

    full, lora = docs_commands("embedding-plan")
    refused = cli_in_process(full.split()[1:])
    assert "(no plan the trainer can run fits)" in refused.stdout, refused.stdout + refused.stderr
    fits = cli_in_process(lora.split()[1:])
    assert fits.returncode == 0, fits.stderr
    assert "* lora ddp dp=1 tp=1 pp=1 ac=none mb=8" in fits.stdout and "pairs/s/dev" in fits.stdout
    assert "global batch 64 pairs" in fits.stdout and "7.11B params" in fits.stdout


def test_the_gradient_cache_costs_a_forward_and_its_gradients_only_with_accumulation():
    """Per rank 8 examples a step: one micro-batch of 8 needs no cache; micro-batches of 4 go through it (up to 4/3
    of the compute, each local row's fp32 gradient kept: 2 rows x 8 examples x 4096 wide x 4 bytes)."""
    workload, cluster = _workload(batch=16), make_cluster(2, None, "H100", "80GB")
    texts = lambda plan: as_texts(plan, workload)  # noqa: E731 - the one-output model's terms count texts
    planned = _planned("e5-mistral-7b", workload)
    whole, cached = classifier_plan("fsdp2", 3, 2, 8), classifier_plan("fsdp2", 3, 2, 4)
    from bigtrain.tasks.classifiers import planner as one_output_planner

    classifier = one_output_planner({**load_model_config("e5-mistral-7b"), "architectures": ["MistralForSequenceClassification"], "pad_token_id": 0, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}, workload)  # fmt: skip
    assert planned.estimate_memory(whole, workload) == classifier.estimate_memory(*as_texts(whole, workload))
    kept = (
        planned.estimate_memory(cached, workload).other_bytes
        - classifier.estimate_memory(*as_texts(cached, workload)).other_bytes
    )
    assert kept >= 2 * 8 * 4096 * 4
    ratio = (
        planned.estimate_time(cached, cluster, workload).compute_s
        / classifier.estimate_time(texts(cached)[0], cluster, texts(cached)[1]).compute_s
    )
    assert 1.25 < ratio <= 4 / 3 + 1e-9  # a micro-step's operator launches are its floor: below 4/3, not above
    assert (
        planned.estimate_time(whole, cluster, workload).compute_s
        == classifier.estimate_time(texts(whole)[0], cluster, texts(whole)[1]).compute_s
    )
