"""The capability table (``config/capabilities/``) with the rows of the tasks and objectives (their specs'): every row
tripped by an example, and every consumer refuses the example with the row's own message: recipe resolution,
start-up (``TrainingJob``), the planner's search (pins as ``bigtrain plan --fix`` gives them), the simulator and
``bigtrain export``. ``plan: auto`` never picks a plan a row refuses, with ``train.compile`` as with any option."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
from cases import CONVERTED_FAMILIES, ROUTED_MIXTRAL, TINY_LLAMA, TP_FAMILIES
from diffusion_cases import TINY_FLUX
from helpers import REPO, make_plan, recipe_dict, save_rows, save_word_tokenizer

from bigtrain.config.capabilities import RULES, ModelFacts, Setup, check, first_problem
from bigtrain.config.hf import hf_config_from_dict, resolve_attention
from bigtrain.config.load import build_dataclass
from bigtrain.config.resolve import parallel_of, resolve_plan
from bigtrain.config.schema import ModelConfig, RecipeConfig, TrainConfig
from bigtrain.config.setup import DataFacts
from bigtrain.config.workload import Workload
from bigtrain.errors import ConfigError
from bigtrain.job import resolve_job
from bigtrain.objectives import OBJECTIVES
from bigtrain.planner.hardware import make_cluster
from bigtrain.planner.model_stats import ModelStats, load_model_config
from bigtrain.planner.search import search
from bigtrain.tasks import TASKS

UNTIED_4 = {**TINY_LLAMA, "num_hidden_layers": 4, "tie_word_embeddings": False}
ONCE, EVERY = "once_per_step", "every_micro_step"
PP2 = dict(pp=2, grad_reduce=ONCE)
RESNET = dict(model_type="resnet", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
VLM = dict(  # a tiny LLaVA (its config as recipes/make_vlm_demo.py builds it)
    model_type="llava",
    text_config=dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=300),
    vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, image_size=16, patch_size=4, projection_dim=32),
)  # fmt: skip
FLUX = {"model_type": "flux_transformer", **TINY_FLUX}
BERT = dict(model_type="bert", vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4)  # fmt: skip
GPT2 = dict(model_type="gpt2", vocab_size=128, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)


@dataclass(frozen=True)
class Example:
    world: int
    plan: dict[str, Any]  # every Plan field that differs from helpers.make_plan's (degrees multiply to ``world``)
    model: dict[str, Any] = field(default_factory=lambda: dict(TINY_LLAMA))
    batch: int = 8
    compile: bool = False
    method: str = "full"
    precision: str = "fp32"
    fp8: str = "none"
    rows_len: int = 17  # tokens per row of the data
    packed: bool = False  # chat-free text records packed into rows (data.packing: documents), else a .npy of rows
    attention: str = "auto"  # model.attn_implementation
    objective: str = "auto"  # train.objective
    task: str = "auto"  # model.task (an embedding model's: the built-in retrieval records as data)
    images: bool = False  # an image classifier's example: the built-in shapes as data (recipe plans, plan exports
    # and the LM planner's statistics refuse the model before any row, which the test checks instead)
    vlm: bool = False  # a vision-language model's: the tiny LLaVA of recipes/make_vlm_demo.py on builtin:image_chat
    train: dict[str, Any] = field(default_factory=dict)  # other train keys (beyond what its objective's example sets)

    def train_keys(self) -> dict[str, Any]:
        """The train keys beyond the fields above: its objective's example's (grpo's reward functions), its own."""
        spec = OBJECTIVES.get(self.objective)
        return {**(dict(spec.example_train) if spec is not None else {}), **self.train}


EXAMPLES: dict[str, Example] = {
    "zero_stage_of_backend": Example(2, dict(backend="ddp", zero_stage=3, dp_replicate=2, grad_reduce=ONCE)),
    "ddp_does_not_shard": Example(2, dict(backend="ddp", zero_stage=0, dp_shard=2, grad_reduce=ONCE)),
    "hybrid_sharding_is_fsdp2": Example(4, dict(backend="deepspeed", dp_replicate=2, dp_shard=2)),
    "offload_params_needs_sharding": Example(
        2, dict(backend="ddp", zero_stage=0, dp_replicate=2, grad_reduce=ONCE, offload_params=True)
    ),
    "deepspeed_offloads_parameters_in_zero3": Example(
        2, dict(backend="deepspeed", zero_stage=2, dp_shard=2, offload_params=True)
    ),
    "offload_optimizer_needs_deepspeed": Example(2, dict(dp_shard=2, offload_optimizer=True)),
    "grad_reduce_of_backend": Example(2, dict(backend="ddp", zero_stage=0, dp_replicate=2, grad_reduce=EVERY)),
    "pipeline_reduces_once": Example(2, dict(pp=2, grad_reduce=EVERY), UNTIED_4),
    "loss_parallel_needs_tp": Example(2, dict(dp_shard=2, loss_parallel=True)),
    "sequence_parallel_needs_tp": Example(2, dict(dp_shard=2, sequence_parallel=True)),
    "virtual_stages_need_pp": Example(2, dict(dp_shard=2, pp_virtual_stages=2)),
    "single_stage_schedules": Example(2, dict(**PP2, pp_virtual_stages=2), UNTIED_4),
    "v_shaped_schedules": Example(2, dict(**PP2, pp_schedule="zbv_zero_bubble"), UNTIED_4),
    "tp_needs_fsdp2": Example(2, dict(backend="ddp", zero_stage=0, tp=2, grad_reduce=ONCE)),
    "pp_needs_fsdp2": Example(2, dict(backend="deepspeed", **PP2), UNTIED_4),
    "split_backward_schedules": Example(
        2, dict(**PP2, pp_schedule="interleaved_zero_bubble", pp_virtual_stages=2), UNTIED_4
    ),
    "loss_parallel_with_pp": Example(4, dict(**PP2, tp=2, loss_parallel=True), UNTIED_4),
    "sequence_parallel_with_pp": Example(4, dict(**PP2, tp=2, sequence_parallel=True), UNTIED_4),
    "compile_with_deepspeed": Example(2, dict(backend="deepspeed", zero_stage=2, dp_shard=2), compile=True),
    "chunked_loss_with_tp": Example(2, dict(tp=2, loss_chunk_tokens=8)),
    "chunked_loss_with_pp": Example(2, dict(**PP2, loss_chunk_tokens=8), UNTIED_4),
    "chunked_loss_with_adapters_on_zero3": Example(
        2, dict(backend="deepspeed", zero_stage=3, dp_shard=2, loss_chunk_tokens=8), method="lora"
    ),
    "chunked_loss_keeps_logit_transform": Example(
        # the key as Gemma 2/3 configs carry it (on a Llama config here: the planner models Llama, not Gemma yet)
        2,
        dict(dp_shard=2, loss_chunk_tokens=8),
        {**TINY_LLAMA, "final_logit_softcapping": 30.0},
    ),
    "offload_activations_with_selective": Example(
        2, dict(dp_shard=2, activation_checkpointing="selective", offload_activations=True)
    ),
    "offload_activations_with_pp": Example(2, dict(**PP2, offload_activations=True), UNTIED_4),
    "offload_activations_with_tp": Example(2, dict(tp=2, offload_activations=True)),
    "sequence_parallel_plain_layout": Example(2, dict(tp=2, sequence_parallel=True), TP_FAMILIES["phi3"]),
    "router_loss_with_pp_or_cp": Example(2, dict(cp=2), ROUTED_MIXTRAL),
    "fp8_with_deepspeed": Example(2, dict(backend="deepspeed", zero_stage=2, dp_shard=2), fp8="tensorwise"),
    "fp8_with_tp_or_pp": Example(2, dict(tp=2), fp8="rowwise"),
    "fp8_with_adapters": Example(2, dict(dp_shard=2), method="lora", fp8="tensorwise"),
    "ep_needs_fsdp2": Example(2, dict(backend="deepspeed", zero_stage=3, ep=2), CONVERTED_FAMILIES["mixtral"]),
    "ep_with_tp_pp_or_cp": Example(4, dict(dp_shard=2, cp=2, ep=2), CONVERTED_FAMILIES["mixtral"], rows_len=16),
    "ep_divides_dp_shard": Example(4, dict(dp_shard=4, ep=3), CONVERTED_FAMILIES["mixtral"]),
    "ep_needs_experts": Example(2, dict(dp_shard=2, ep=2)),
    "ep_divides_experts": Example(4, dict(dp_shard=4, ep=4), {**CONVERTED_FAMILIES["mixtral"], "num_local_experts": 6}),
    "cp_backends": Example(2, dict(backend="deepspeed", cp=2)),
    "cp_with_tp_or_pp": Example(4, dict(cp=2, tp=2), UNTIED_4),
    "cp_divides_heads": Example(4, dict(cp=4), UNTIED_4),
    "cp_divides_rows": Example(2, dict(cp=2)),
    "cp_with_packed_documents": Example(2, dict(cp=2), rows_len=16, packed=True),
    "cp_attention": Example(2, dict(cp=2), rows_len=16, attention="eager"),
    "ep_with_adapters": Example(2, dict(dp_shard=2, ep=2), CONVERTED_FAMILIES["mixtral"], method="lora"),
    "ep_with_hybrid_sharding": Example(4, dict(dp_replicate=2, dp_shard=2, ep=2), CONVERTED_FAMILIES["mixtral"]),
    "ep_with_selective_on_some_families": Example(
        2, dict(dp_shard=2, ep=2, activation_checkpointing="selective"), CONVERTED_FAMILIES["deepseek_v3"]
    ),
    "qlora_computes_in_bf16": Example(2, dict(dp_shard=2), method="qlora"),
    "adapters_without_block_linears": Example(2, dict(dp_shard=2), RESNET, images=True, method="lora"),
    "adapters_with_tp": Example(2, dict(tp=2), method="lora"),
    "adapters_with_pp": Example(2, PP2, UNTIED_4, method="lora"),
    "qlora_fsdp2_shards": Example(2, dict(dp_replicate=2), method="qlora", precision="bf16"),
    "qlora_with_deepspeed": Example(
        2, dict(backend="deepspeed", zero_stage=3, dp_shard=2), method="qlora", precision="bf16"
    ),
    "batch_splits_into_micro_batches": Example(2, dict(dp_shard=2, micro_batch_size=2), batch=6),
    "tp_layout_shipped": Example(2, dict(tp=2), GPT2),
    "tp_style_not_mapped": Example(2, dict(tp=2), CONVERTED_FAMILIES["mixtral"]),
    "tp_divides_heads": Example(4, dict(tp=4)),
    "loss_parallel_untied": Example(2, dict(tp=2, loss_parallel=True)),
    "loss_parallel_divides_vocab": Example(
        4, dict(tp=4, loss_parallel=True), {**UNTIED_4, "vocab_size": 130, "num_key_value_heads": 4}
    ),
    "pp_layout_shipped": Example(2, PP2, GPT2),
    "pp_untied": Example(2, PP2),
    "pp_stages_within_layers": Example(
        2, dict(**PP2, pp_schedule="interleaved_1f1b", pp_virtual_stages=2), {**UNTIED_4, "num_hidden_layers": 2}
    ),
    "interleaved_rounds": Example(
        2, dict(**PP2, pp_schedule="interleaved_1f1b", pp_virtual_stages=2), UNTIED_4, batch=5
    ),
    "pp_enough_micro_batches": Example(2, dict(**PP2, micro_batch_size=4), UNTIED_4, batch=4),
    "classifier_with_model_parallelism": Example(2, dict(tp=2), RESNET, images=True),
    "classifier_with_block_transforms": Example(2, dict(dp_shard=2), RESNET, images=True, fp8="tensorwise"),
    "batchnorm_recomputed": Example(2, dict(dp_shard=2, activation_checkpointing="full"), RESNET, images=True),
    "batchnorm_compiled": Example(2, dict(dp_shard=2), RESNET, images=True, compile=True),
    "sync_batchnorm_without_batchnorm": Example(2, dict(dp_shard=2, sync_batchnorm=True)),
    "channels_last_without_convolutions": Example(2, dict(dp_shard=2, channels_last=True)),
    "sync_values_allowed": Example(2, dict(dp_replicate=2, sync="sometimes")),
    "needs_replica_groups": Example(2, dict(dp_shard=2, sync="diloco")),
    "period_and_fragments": Example(2, dict(dp_replicate=2, sync="diloco", sync_every=5, fragments=2)),
    "outer_step": Example(2, dict(dp_replicate=2, sync="diloco", outer_lr=0.0)),
    "semi_synchronous_engines": Example(4, dict(**PP2, dp_replicate=2, sync="local_sgd"), UNTIED_4),
    "replica_failures": Example(2, dict(dp_replicate=2, replica_failures="continue")),
    "reference_value": Example(2, dict(dp_shard=2, reference="nearby"), objective="dpo"),
    "reference_without_its_objective": Example(2, dict(dp_shard=2, reference="sharded"), objective="orpo"),
    "reference_against_the_method": Example(2, dict(dp_shard=2, reference="adapter_disabled"), objective="dpo"),
    "preference_with_model_parallelism": Example(2, dict(tp=2), objective="dpo"),
    "online_rl_with_model_parallelism": Example(2, dict(tp=2), objective="grpo"),
    "precomputed_reference": Example(
        2, dict(dp_shard=2, reference="precomputed"), objective="grpo", train={"beta": 0.04}
    ),
    "selective_checkpointing_on_zero3": Example(
        2,
        dict(backend="deepspeed", zero_stage=3, dp_shard=2, activation_checkpointing="selective"),
        BERT,
        objective="contrastive",
        task="embedding",
    ),
    "negatives_of_one_replica_group": Example(
        2, dict(dp_replicate=2, sync="diloco"), BERT, objective="contrastive", task="embedding"
    ),
    "frozen_parts_value": Example(2, dict(dp_shard=2, frozen_parts="gpu")),
    "frozen_parts_without_a_pipeline": Example(2, dict(dp_shard=2, frozen_parts="device")),
    "unverified_for_diffusion": Example(
        2,
        dict(backend="deepspeed", zero_stage=3, dp_shard=2, activation_checkpointing="selective"),
        FLUX,
        task="text-to-image",
        rows_len=8,
    ),
    "vision_language_with_model_parallelism": Example(4, dict(pp=2, dp_shard=2), vlm=True),
    "vision_language_with_untested_options": Example(2, dict(dp_shard=2), vlm=True, compile=True),
    "offloaded_reference_engines": Example(
        2, dict(backend="ddp", zero_stage=0, dp_replicate=2, grad_reduce=ONCE, reference="offloaded"), objective="ipo"
    ),
}
# the capability records' rows and every task's and objective's own (the preference objectives share theirs)
JOB_RULES = [rule for spec in (*TASKS.values(), *OBJECTIVES.values()) for rule in spec.rules]
ROWS = {rule.name: rule for rule in (*RULES, *JOB_RULES)}


def test_every_row_has_an_example_and_every_example_a_row():
    assert set(EXAMPLES) == set(ROWS)


def job_of(ex: Example) -> tuple[Any, Any]:
    """The example's job (its task and objective) and its model config, resolved as start-up resolves them."""
    from bigtrain.models.build import load_hf_config

    model = ModelConfig(config=VLM if ex.vlm else ex.model, task=ex.task)  # the tiny LLaVA's, as its folder holds it
    return resolve_job(RecipeConfig(model=model, train=train_of(ex)), load_hf_config(model))


def config_of(ex: Example) -> Any:
    return job_of(ex)[1]


def facts_of(ex: Example) -> ModelFacts:
    """The model's facts as start-up reads them (its task measures BatchNorm and convolutions)."""
    job, hf_config = job_of(ex)
    return ModelFacts.of(hf_config, **(job.task.model_facts(hf_config) if job.task.model_facts else {}))


def expected_message(name: str) -> str:
    """The row's message for its example; the example trips this row first (and no row above it)."""
    ex = EXAMPLES[name]
    job, hf_config = job_of(ex)
    setup = Setup(make_plan(**ex.plan), train_of(ex), facts_of(ex), data_of(ex, hf_config), job.facts)
    problem = first_problem(setup)
    assert problem is not None and problem.rule.name == name, problem
    return problem.message


def data_of(ex: Example, hf_config: Any) -> DataFacts:
    return DataFacts(ex.rows_len, ex.packed, resolve_attention(hf_config, ex.attention))


def train_of(ex: Example) -> TrainConfig:
    return TrainConfig(
        global_batch_size=ex.batch,
        compile=ex.compile,
        method=ex.method,
        mixed_precision=ex.precision,
        fp8=ex.fp8,
        objective=ex.objective,
        **ex.train_keys(),
    )


def recipe_of(ex: Example, tmp_path) -> RecipeConfig:
    model: Any = ex.model
    if ex.vlm:
        sys.path.insert(0, str(REPO / "recipes"))
        from make_vlm_demo import save_tiny_vlm

        model = save_tiny_vlm(tmp_path / "vlm")
        data = {"path": "builtin:image_chat", "seq_len": 256}
    elif ex.images:
        data = {"path": "builtin:shapes", "image_size": 16}
    elif ex.task == "embedding":
        data = {"path": "builtin:retrieval", "seq_len": 64}
    elif ex.task == "text-to-image":  # a tiny FLUX pipeline's folder and captioned images of 16 px
        from diffusion_cases import IMAGE_SIZE, captioned_folder, pipeline_folder

        model = pipeline_folder(tmp_path)
        data = {"path": str(captioned_folder(tmp_path)), "image_size": IMAGE_SIZE, "seq_len": ex.rows_len}
    elif ex.packed:  # text records packed whole into rows, kept apart by their position ids
        records = tmp_path / "records.jsonl"
        records.write_text("".join('{"text": "hello world hello"}\n' for _ in range(80)))
        tokenizer = save_word_tokenizer(tmp_path / "tokenizer")
        data = {"path": str(records), "tokenizer": str(tokenizer), "packing": "documents", "seq_len": ex.rows_len}
    else:
        data = {"path": str(save_rows(tmp_path / "rows.npy", seq_len=ex.rows_len))}
    raw = recipe_dict(
        tmp_path / "out",
        data["path"],
        model,
        data=data,
        train={
            "global_batch_size": ex.batch,
            "compile": ex.compile,
            "method": ex.method,
            "fp8": ex.fp8,
            "mixed_precision": ex.precision,
            "objective": ex.objective,
            **ex.train_keys(),
        },
        parallel=make_plan(**ex.plan).to_dict(),
    )
    raw["model"]["attn_implementation"] = ex.attention
    raw["model"]["task"] = ex.task
    return build_dataclass(RecipeConfig, raw, "")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_consumer_refuses_the_example_with_the_row_s_message(name, tmp_path):
    from bigtrain.api import recipe_plan
    from bigtrain.measure.simulate import simulate
    from bigtrain.runtime import LaunchEnv
    from bigtrain.train.run import TrainingJob

    ex, message = EXAMPLES[name], expected_message(name)
    job, hf_config = job_of(ex)
    cfg = recipe_of(ex, tmp_path)
    plan = make_plan(**ex.plan)

    if not (ROWS[name].reads_model or ROWS[name].reads_data):  # recipe resolution, before model and data are read
        with pytest.raises(ConfigError) as e:
            resolve_plan(parallel_of(plan.to_dict()), ex.world, train_of(ex), job.facts)
        assert str(e.value) == message

    env = LaunchEnv(rank=0, world_size=ex.world, local_rank=0, local_world_size=ex.world, launched=True)
    with pytest.raises(ConfigError) as e:  # start-up, on every rank, before any process group
        TrainingJob(cfg, env)
    assert str(e.value) == message

    with pytest.raises(ConfigError) as e:
        recipe_plan(cfg, gpus=ex.world).export("accelerate")
    assert str(e.value) == message

    if ex.vlm:
        sizes = dict(seq_len=256)
    elif ex.images:
        sizes = dict(seq_len=1, image_size=16)
    elif ex.task == "text-to-image":
        sizes = dict(seq_len=ex.rows_len, image_size=16)
    else:
        sizes = dict(
            seq_len=ex.rows_len, packed=ex.packed, attention=ex.attention if ex.attention != "auto" else "sdpa"
        )
    workload = Workload(
        global_batch_size=ex.batch, mixed_precision=ex.precision, compile=ex.compile, method=ex.method, fp8=ex.fp8,
        job=job.facts, **sizes,
    )  # fmt: skip
    model_config = {**hf_config.to_dict(), "model_type": hf_config.model_type}  # naming its task's class
    with pytest.raises(ConfigError) as e:
        simulate(model_config, plan, workload)
    assert str(e.value) == message

    # the planner with every plan field pinned (bigtrain plan --fix ...): the candidate says why, or the pins do
    model = job.task.planner(model_config, workload)
    try:
        candidates = search(model, make_cluster(ex.world, None, "H100", "80GB"), workload, fixed=plan.to_dict())
    except ConfigError as e:
        assert str(e) == message
    else:
        assert [c.plan for c in candidates] == [plan]
        assert message in (candidates[0].rejected_because, candidates[0].unsupported)


def test_an_objective_a_task_does_not_give_is_refused_before_its_data_by_every_consumer(tmp_path):
    """dpo reads the log-probabilities of token rows, which an image classifier does not give: start-up refuses it
    before reading any data, ``bigtrain plan`` with the words it uses for the argument."""
    import bigtrain
    from bigtrain.runtime import LaunchEnv
    from bigtrain.train.run import TrainingJob

    ex = Example(2, dict(dp_shard=2), RESNET, images=True, objective="dpo")
    said = "train.objective=dpo compares the log-probabilities of two answers, which a image-classification model"
    with pytest.raises(ConfigError, match=said):
        job_of(ex)
    env = LaunchEnv(rank=0, world_size=2, local_rank=0, local_world_size=2, launched=True)
    with pytest.raises(ConfigError, match=said):
        TrainingJob(recipe_of(ex, tmp_path), env)
    with pytest.raises(ConfigError, match=said):
        bigtrain.plan("resnet-50", gpus=8, gpu="A100", objective="dpo")


def test_a_plan_no_row_refuses_passes_every_consumer_s_check(tmp_path):
    """The control: the table's first example with its offending key set back runs the same checks cleanly."""
    ex = Example(2, dict(dp_shard=2, micro_batch_size=2), UNTIED_4, batch=8)
    plan = make_plan(**ex.plan)
    job = job_of(ex)[0].facts
    assert first_problem(Setup(plan, train_of(ex), ModelFacts.of(hf_config_from_dict(ex.model)), job=job)) is None
    assert resolve_plan(parallel_of(plan.to_dict()), 2, train_of(ex), job) == plan


def test_plan_auto_never_picks_a_plan_start_up_refuses_with_train_compile():
    """With train.compile the DeepSpeed plans are predicted but not offered; the choice passes start-up's check."""
    from bigtrain.planner.auto import choose_plan

    config = load_model_config("llama-3-8b")
    stats = ModelStats.from_config(config)
    facts = stats.facts
    picked = 0
    for gpus, memory in ((1, "80GB"), (8, "24GB"), (16, "40GB")):
        cluster = make_cluster(gpus, None, "H100", memory)
        for compile_blocks in (False, True):
            workload = Workload(seq_len=2048, global_batch_size=8 * gpus, compile=compile_blocks)
            candidates = search(stats, cluster, workload)
            offered = [c.plan.backend for c in candidates if c.runnable]
            assert ("deepspeed" in offered) != compile_blocks, (gpus, memory, compile_blocks)
            try:
                plan = choose_plan(stats, gpus, gpus, "H100", cluster.gpu.memory_bytes, workload).plan
            except ConfigError:
                continue  # nothing fits: nothing is picked
            check(Setup(plan, workload.train_config(), facts))
            picked += 1
    assert picked >= 4  # with and without compile on the larger clusters


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_row_not_marked_as_reading_the_micro_batch_does_not(name):
    """The search judges a layout's frame once by the rows not marked ``reads_micro_batch`` and skips (or shows by
    one plan) every micro-batch and checkpointing of a frame they refuse: such a row must say the same for each."""
    ex, rule = EXAMPLES[name], ROWS[name]
    job, hf_config = job_of(ex)
    facts, data = facts_of(ex), data_of(ex, hf_config)
    verdicts = {
        (mb, ac): rule.says(Setup(make_plan(**{**ex.plan, "micro_batch_size": mb, "activation_checkpointing": ac}),
                                  train_of(ex), facts, data, job.facts)) is not None
        for mb in (1, 2, 4)
        for ac in ("none", "selective", "full")
    }  # fmt: skip
    if rule.reads_micro_batch:
        assert len(set(verdicts.values())) == 2, f"{name} is marked as reading them but does not: {verdicts}"
    else:
        assert set(verdicts.values()) == {True}, verdicts


def test_every_record_names_real_keys_and_transforms_and_every_transform_has_a_record():
    """A record's recipe keys are schema keys (``model.config.*``: the HF config's own), its transforms are in
    ``ORDER``, and every transform but the values' loading belongs to exactly one record."""
    from bigtrain.config.capabilities import CAPABILITIES
    from bigtrain.config.schema import recipe_key
    from bigtrain.parallel.transforms import ORDER

    schema = {
        f"{section}.{recipe_key(f)}"
        for section in ("model", "data", "train", "parallel", "checkpoint", "lora")
        for f in dataclasses.fields(type(getattr(RecipeConfig(), section)))
    }
    for capability in CAPABILITIES:
        unknown = [k for k in capability.keys if k not in schema and not k.startswith("model.config.")]
        assert not unknown, (capability.name, unknown)
    owners = [t for c in CAPABILITIES for t in c.transforms] + [s.name for c in CAPABILITIES for s in c.steps]
    assert sorted(owners) == sorted(t.name for t in ORDER if t.name != "load_values")
