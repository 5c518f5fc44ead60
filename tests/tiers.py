"""Which tier a test runs in, where its own module does not say: CI's time, shared out in one place.

CI runs the default tier (the README's command, aimed at 12 minutes on 2 cores), then what the full tier adds (25
minutes in all). Tests are in the default tier unless marked ``full`` or ``extended``; most modules mark their own
cases (``pytest.mark.full``, a module's ``FULL_ONLY``). The ids below (a test, or one case of a parametrisation, as
pytest names it) are marked here by ``tests/conftest.py`` before selection:

- ``FULL``: run by CI's second step only.
- ``EXTENDED``: beyond CI (``python -m pytest -m extended``; ``-m full`` runs them with everything else). They are
  further cases of what CI proves once: the other families' and plans' launches at 4 and 8 ranks, the memory cases
  beyond each kind's first (their benchmarks in ``bench/`` print the same comparisons), walk-throughs beyond the first,
  resumes onto every other plan. Whoever changes what one of them covers runs ``-m extended`` on its module before
  closing the issue; docs/testing.md lists what each tier holds and what it took.

An id whose module is gone, or that names no test of a module pytest collected, fails the run (``stale_entries``),
so the lists cannot rot.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

FULL = (
    # the diffusion transformers' recorded statistics measured again at their full size (50 s each, 12 min 8 s for
    # the default tier with them, 2026-11-29 from a clean clone of a6f14b1): the other presets' checks stay
    "tests/unit/test_known_configs.py::test_a_recorded_preset_is_what_transformers_gives[flux.1-dev]",
    "tests/unit/test_known_configs.py::test_a_recorded_preset_is_what_transformers_gives[sd3.5-large]",
    # ConvNeXt-B's published FLOPs (6-8 s: the other classifiers' counts stay): the default tier gains the
    # text-to-image generate and plan tests, and the classifiers' measuring of backward's temporaries
    "tests/unit/test_classifier_planner.py::test_training_flops_per_image_are_three_published_forwards[convnext-base]",
    # the embedding model's (2026-11-29: the default tier measured 11 min 44 s with them and other work beside it):
    # the gather with its graph on 2 spawned ranks (the FSDP2 launch without the cache stays) and the resume
    "tests/unit/test_in_batch_negatives.py::test_two_ranks_gather_every_negative_and_their_gradients_add_up_to_one_pass_s[whole-step]",
    "tests/integration/test_embedding_runs.py::test_a_resumed_embedding_run_equals_the_run_that_never_stopped",
    "tests/integration/test_embedding_runs.py::test_deepspeed_replays_the_dropout_masks_as_the_torch_native_engine_does",
    # (and 11 min 49 s from a clean clone of dd90892, nothing beside it): the embedding planner's presets, measured on
    # fake tensors at 512 tokens (11 s for e5-mistral-7b's; its docs commands and the cache's terms read the same)
    "tests/unit/test_embedding_planner.py",
    # the text-to-image task's consumers (a tiny FLUX pipeline saved and read by each, 6.5 s): the default tier stays
    # under 12 minutes
    "tests/unit/test_capabilities.py::test_every_consumer_refuses_the_example_with_the_row_s_message"
    "[unverified_for_diffusion]",
    # the default tier measured 12 min 33 s with the elastic runs' cases (2026-11-29): DDP's equivalence launch (the
    # torch-native engine's other cases stay) and ViT-large's published count (vit-base's stays) moved here
    "tests/distributed/test_equivalence.py::test_plan_matches_single_process_loop[llama-tied-ddp-2ranks-accum2]",
    "tests/unit/test_classifier_planner.py::test_the_planner_s_own_count_is_the_published_one[vit-large]",
    # a 2-rank launch whose reward function raises on one rank (grpo's other bad input stays in the default tier)
    "tests/integration/test_grpo_runs.py::test_a_reward_function_that_raises_stops_every_rank_with_its_line[fsdp2]",
    "tests/integration/test_grpo_runs.py::test_a_reward_function_that_raises_stops_every_rank_with_its_line[zero3]",
    "tests/distributed/test_checkpoint_resume.py::test_resume_on_the_same_plan_continues_exactly[deepspeed]",
    "tests/integration/test_plan_cli.py::test_recipe_with_plan_auto_trains",
    "tests/integration/test_deepspeed.py::test_a_deepspeed_json_that_contradicts_the_recipe_is_one_line",
    "tests/integration/test_fine_tune_outputs.py::test_eval_tensorboard_and_report",
    "tests/integration/test_vision_language_outputs.py::test_fine_tuned_model_and_its_export_give_the_trained_logits",
    "tests/integration/test_export.py::test_every_recipe_exports_to_each_target_or_names_what_it_cannot",
    "tests/integration/test_crash_safety.py::test_a_shard_damaged_in_place_is_named_and_the_previous_checkpoint_resumes",
    "tests/integration/test_bad_input.py::test_token_ids_outside_the_vocabulary_fail_at_load_on_every_rank",
    "tests/distributed/test_pipeline_memory.py",
    "tests/unit/test_classifier_planner.py::test_the_planner_s_own_count_is_the_published_one[bert-large]",
    "tests/distributed/test_preference_memory.py",
    "tests/distributed/test_adapters.py::test_lora_matches_a_peft_loop_and_saves_the_whole_adapter[ddp-2ranks-accum2]",
    # every path CI proves once (issue 52): torchft's replica failure and join, the HF Trainer / TRL / accelerate
    # routes, a classifier's resume and replaced head, a vision-language model's resume and adapter read by peft, the
    # capability pairs' covering plans on every job
    "tests/distributed/test_replica_sync.py::test_replica_groups_joined_by_torchft_train_the_same_model",
    "tests/integration/test_replica_failures.py::test_a_killed_replica_group_leaves_the_other_training_and_rejoins_with_its_state",
    "tests/integration/test_vision_language_outputs.py::test_resume_on_another_plan_continues_exactly_and_keeps_the_frozen_tower",
    "tests/integration/test_vision_language_outputs.py::test_adapter_loads_with_peft_and_gives_the_trained_logits",
    "tests/integration/test_classifiers.py",
    "tests/integration/test_api_routes.py",
    "tests/integration/test_trl_dpo.py::test_the_trl_dpo_route_runs_the_plan",
    "tests/distributed/test_pair_simulation.py",
    # bigtrain train --nproc's own check of output_dir, before any worker (a recipe that leaves train.objective out
    # was once refused as "another recipe" on resume)
    "tests/integration/test_checkpoint_errors.py::test_a_finished_run_started_again_says_so_and_exits_0",
    # issue 53's additions brought the default tier to its 12 minutes: BERT's published counts run here both (the
    # vision families' stay in the default tier), bert-large's preset beside bert-base's, and a stream's chat
    # resume (its text resume stays)
    "tests/unit/test_classifier_planner.py::test_the_planner_s_own_count_is_the_published_one[bert-base]",
    "tests/unit/test_known_configs.py::test_a_recorded_preset_is_what_transformers_gives[bert-large]",
    "tests/unit/test_stream.py::test_a_saved_position_reads_on_exactly_across_epochs[chat-documents]",
    # and the default tier measured 12 min 41 s from a clean clone with nothing beside it (2026-11-28, the machine
    # slower than the day before: the same launches took 10-20% longer): these run once in CI's second step instead,
    # each the only case of its kind (convnext's count beside resnet-50's and the ViTs', the first plan: auto seed,
    # the toy capability through every consumer, a save killed half-way and the straight run it needs)
    "tests/unit/test_classifier_planner.py::test_the_planner_s_own_count_is_the_published_one[convnext-base]",
    "tests/unit/test_auto_passes_start_up.py::test_plan_auto_chooses_what_start_up_accepts[0]",
    "tests/integration/test_a_capability_is_one_file.py::test_every_consumer_sees_the_toy",
    "tests/integration/test_crash_safety.py::test_a_save_killed_half_way_leaves_the_previous_checkpoint_in_charge",
    # grpo brought the default tier to 12 min 26 s (a clean clone of 78f4d64, nothing beside it): resnet-50's
    # published count runs here (the ViTs' stay in the default tier), as do grpo's chat prompts and its step against
    # TRL (its plans against the plain loop, its generation and its bad input stay)
    "tests/unit/test_classifier_planner.py::test_the_planner_s_own_count_is_the_published_one[resnet-50]",
    "tests/integration/test_grpo_runs.py::test_chat_prompts_are_templated_and_their_completions_are_assistant_messages",
    "tests/integration/test_trl_grpo.py::test_grpo_step_equals_trl_s_on_the_same_completions[dapo]",
    # grpo's planned rollout (its memory against the simulated step, its plan and its arguments) added ~15 s: two
    # more recorded presets run here, each beside one of its kind that stays (vit-base, resnet-50's own count)
    "tests/unit/test_known_configs.py::test_a_recorded_preset_is_what_transformers_gives[vit-large]",
    "tests/unit/test_known_configs.py::test_a_recorded_preset_is_what_transformers_gives[convnext-base]",
    # and the default tier measured 13 min 27 s from a clean clone of 301a579 (the same launches 5-10% slower than the
    # day before): these run once in CI's second step instead, each a path no other default case needs (the 4-rank
    # HSDP launch, 43 s; the published ViT count beside the other published counts there; the
    # written plan's imports; the toy task's 2-rank training, whose every other consumer stays)
    "tests/distributed/test_equivalence.py::test_plan_matches_single_process_loop[llama-tied-hsdp-2x2-reduce-every]",
    "tests/unit/test_classifier_planner.py::test_the_planner_s_own_count_is_the_published_one[vit-base]",
    "tests/unit/test_plan_imports.py::test_training_with_a_written_plan_never_imports_the_search",
    "tests/integration/test_a_task_is_one_file.py::test_training_on_two_ranks_steps_as_a_plain_loop_and_exports_the_head",
    # the default tier measured 15 min 28 s from a clean clone of 791b55a with other work beside it (~13 min without):
    # these launches run once in CI's second step instead, each the default tier's only one of its kind (the 4-rank
    # 2-D mesh, 53 s; the same-plan resume, whose resume onto another world size stays, 34 s; ResNet's BatchNorm per
    # rank on DDP, whose synchronised and channels-last cases stay, 31 s)
    "tests/distributed/test_equivalence.py::test_plan_matches_single_process_loop[llama-4layers-tp2-dp_shard2-accum2-ac-full]",
    "tests/distributed/test_checkpoint_resume.py::test_resume_on_the_same_plan_continues_exactly[fsdp2]",
    "tests/distributed/test_classification.py::test_classifier_matches_a_plain_loop[resnet-ddp-2ranks-accum2]",
)

EXTENDED = (
    # walk-throughs beyond the first (the full tier measured 44 min 14 s with work beside it, 2026-11-29): the elastic
    # drill of docs/elastic.md (40 s; the same re-plan from 4 ranks to 3 and the replica groups' drill as written stay
    # in the full tier) and grpo's (44 s; its plans against the plain loop and its bad input stay)
    "tests/integration/test_walkthroughs.py::test_elastic_drill_runs_as_written",
    "tests/integration/test_walkthroughs.py::test_grpo_walkthrough_runs_as_written",
    # docs/embedding.md's (100 s): its 2-rank evaluation over the whole held-out set and the folder sentence-
    # transformers reads stay in the full tier (test_embedding_export.py)
    "tests/integration/test_walkthroughs.py::test_embedding_walkthrough_runs_as_written",
    # GPT-2 under FSDP2 (79 s in .ci/run, 2026-11-29): GPT-2's DDP case stays in the full tier, FSDP2's reduce-every
    # mode with Gemma 2, OLMo-2 and Mixtral
    "tests/distributed/test_equivalence.py::test_plan_matches_single_process_loop[gpt2-fsdp2-2ranks-mb1-reduce-every]",
    # an elastic re-plan that also drops tp (the FSDP2 -> DDP re-plan of the same code path runs in the full tier)
    "tests/integration/test_elastic.py::test_a_rank_lost_for_good_is_replanned_on_the_rest_and_trains_as_the_new_plan_written_by_hand[fsdp2-tp2]",
    # the equivalence launches at 1, 4 and 8 ranks beyond the default tier's (the 2-rank and DeepSpeed families stay)
    "tests/distributed/test_equivalence.py::test_plan_matches_single_process_loop[llama-tied-1rank-no-accum]",
    "tests/distributed/test_equivalence.py::test_plan_matches_single_process_loop[llama-tied-hsdp-2x2-reduce-once]",
    "tests/distributed/test_equivalence.py::test_plan_matches_single_process_loop[llama-4layers-tp2-dp_shard2-loss_parallel-accum2]",
    "tests/distributed/test_equivalence.py::test_plan_matches_single_process_loop[llama-4layers-tp2-dp_shard2-loss_parallel-accum2-ac-every2]",
    "tests/distributed/test_equivalence.py::test_plan_matches_single_process_loop[deepseek_v3-fsdp2-ep2-dp_shard4-accum2]",
    "tests/distributed/test_equivalence.py::test_plan_matches_single_process_loop[mixtral-hsdp-2x4-ep2]",
    # each capability's further plans (their first runs in the default or the full tier)
    *(
        f"tests/distributed/test_fp8.py::test_fp8_matches_a_loop_over_torchao_float8_linears[{plan}-{scaling}]"
        for plan in (
            "1rank-mb1-accum8-ac-selective",
            "ddp-2ranks-mb1-accum4-ac-selective",
            "ddp-2ranks-mb1-accum4-ac-full",
            "ddp-2ranks-mb1-accum4-ac-every2-offload",
            "fsdp2-2ranks-mb1-accum4-offload-params",
            "hsdp-2x2-mb1-accum2",
        )
        for scaling in ("tensorwise", "rowwise")
    ),
    "tests/distributed/test_moe.py::test_moe_with_its_router_loss_matches_the_single_process_loop[fsdp2-ep2-dp_shard4-4ranks-mb1-accum2-ac-every2-chunked-loss-offload]",
    "tests/distributed/test_moe.py::test_moe_with_its_router_loss_matches_the_single_process_loop[deepspeed-zero3-2ranks-mb1-accum4]",
    "tests/distributed/test_moe.py::test_ep_splits_the_experts_and_fsdp2_shards_each_one",
    "tests/distributed/test_moe.py::test_an_ep_checkpoint_resumes_without_ep_and_exports_the_family_s_format",
    "tests/distributed/test_context_parallel.py::test_context_parallel_matches_the_single_process_loop[fsdp2-cp2-dp_shard2-accum2-ac-full]",
    "tests/distributed/test_context_parallel.py::test_context_parallel_matches_the_single_process_loop[fsdp2-cp2-accum4]",
    "tests/distributed/test_context_parallel.py::test_lora_at_long_context_runs_with_context_parallelism",
    "tests/distributed/test_vision_language.py::test_vision_language_plan_matches_a_plain_loop[llava-zero3-accum2-frozen-vision]",
    "tests/distributed/test_vision_language.py::test_vision_language_plan_matches_a_plain_loop[qwen2_5_vl-ddp-frozen-vision]",
    "tests/distributed/test_vision_language.py::test_vision_language_plan_matches_a_plain_loop[idefics3-zero2-ac-selective]",
    "tests/distributed/test_adapters.py::test_lora_matches_a_peft_loop_and_saves_the_whole_adapter[deepspeed-zero3-ac-selective-accum2]",
    "tests/distributed/test_adapters.py::test_lora_matches_a_peft_loop_and_saves_the_whole_adapter[hsdp-2x2-accum2]",
    "tests/distributed/test_adapters.py::test_lora_matches_a_peft_loop_and_saves_the_whole_adapter[deepspeed-zero2-ac-every2-offload-chunked-loss-accum2]",
    "tests/distributed/test_adapters.py::test_lora_matches_a_peft_loop_and_saves_the_whole_adapter[1rank-compile-accum2]",
    "tests/distributed/test_adapters.py::test_lora_matches_a_peft_loop_and_saves_the_whole_adapter[fsdp2-zero2-ac-full-accum4]",
    "tests/distributed/test_adapters.py::test_qlora_matches_a_peft_loop_over_the_same_nf4_base[ddp-2ranks-accum2]",
    "tests/distributed/test_adapters.py::test_method_auto_is_chosen_at_start_up_and_recorded",
    "tests/distributed/test_adapters.py::test_an_adapter_checkpoint_holds_the_adapters_resumes_on_another_plan_and_refuses_a_changed_base",
    "tests/distributed/test_classification.py::test_classifier_matches_a_plain_loop[resnet-deepspeed-zero2-accum2]",
    "tests/distributed/test_classification.py::test_classifier_matches_a_plain_loop[resnet-fsdp2-2ranks-accum2-channels_last]",
    "tests/distributed/test_classification.py::test_classifier_matches_a_plain_loop[resnet-hsdp-2x2-accum2]",
    "tests/distributed/test_classification.py::test_classifier_matches_a_plain_loop[resnet-deepspeed-zero3-accum2]",
    "tests/distributed/test_classification.py::test_classifier_matches_a_plain_loop[resnet-1rank-accum2]",
    "tests/distributed/test_masked_equivalence.py::test_chat_plan_matches_assistant_only_loop[1rank-accum2]",
    "tests/distributed/test_preference.py::test_preference_plan_matches_the_plain_loop[dpo-full-zero3-sharded]",
    "tests/distributed/test_preference.py::test_preference_plan_matches_the_plain_loop[dpo-full-fsdp2-offloaded]",
    "tests/distributed/test_preference.py::test_preference_plan_matches_the_plain_loop[dpo-full-hsdp-sharded]",
    "tests/distributed/test_replica_sync.py::test_with_h1_local_sgd_and_diloco_with_outer_lr_1_momentum_0_are_the_same_run",
    "tests/distributed/test_replica_sync.py::test_replicas_train_what_r_copies_with_an_outer_step_train[hsdp2x2-streaming-F2-tau1]",
    "tests/distributed/test_replica_sync.py::test_replicas_train_what_r_copies_with_an_outer_step_train[hsdp2x2-local-sgd-H4]",
    "tests/distributed/test_replica_sync.py::test_replicas_train_what_r_copies_with_an_outer_step_train[ddp2-diloco-H4]",
    "tests/distributed/test_replica_sync.py::test_checkpoints_move_between_every_step_and_semi_synchronous_training",
    "tests/distributed/test_replica_sync.py::test_a_checkpoint_resumes_on_another_number_of_replica_groups",
    "tests/distributed/test_replica_sync.py::test_a_bf16_outer_all_reduce_stays_near_the_fp32_run",
    "tests/distributed/test_replica_sync.py::test_resume_in_the_middle_of_an_outer_period_is_exact",
    "tests/integration/test_precision.py::test_bf16_stays_within_2_percent_of_fp32",
    "tests/integration/test_plan_cli.py::test_compile_and_fp8_auto_are_chosen_at_start_and_recorded",
    *(
        f"tests/unit/test_auto_passes_start_up.py::test_plan_auto_chooses_what_start_up_accepts[{s}]"
        for s in range(1, 8)
    ),
    # resumes onto every other world and plan (the default tier resumes FSDP2 onto one rank, the full tier DeepSpeed)
    "tests/distributed/test_checkpoint_resume.py::test_resume_on_the_same_plan_continues_exactly[ddp]",
    "tests/distributed/test_checkpoint_resume.py::test_a_2rank_deepspeed_checkpoint_resumes_on_one_rank",
    "tests/distributed/test_checkpoint_resume.py::test_a_2rank_fsdp2_checkpoint_resumes_on_another_world_or_plan[hsdp-2x2]",
    "tests/distributed/test_checkpoint_resume.py::test_a_2rank_fsdp2_checkpoint_resumes_on_another_world_or_plan[ddp-2ranks]",
    "tests/distributed/test_checkpoint_resume.py::test_a_2rank_fsdp2_checkpoint_resumes_on_another_world_or_plan[deepspeed-zero3]",
    "tests/distributed/test_checkpoint_resume.py::test_a_2rank_fsdp2_checkpoint_resumes_on_another_world_or_plan[tp2]",
    "tests/distributed/test_checkpoint_resume.py::test_a_2rank_fsdp2_checkpoint_resumes_on_another_world_or_plan[pp2]",
    "tests/distributed/test_checkpoint_resume.py::test_a_pipeline_checkpoint_resumes_without_pipeline_and_exports_the_same_model",
    "tests/distributed/test_materialize.py::test_from_scratch_init_does_not_depend_on_the_plan",
    "tests/distributed/test_materialize.py::test_ranks_hold_only_their_shard_of_the_checkpoint[tp2-x-dp_shard2]",
    # memory against the simulated step beyond each kind's first cases (bench/ prints the same comparisons)
    "tests/distributed/test_deepspeed_memory.py",
    "tests/distributed/test_memory_matrix.py::test_analytic_peak_within_10_percent_of_simulation",
    "tests/distributed/test_real_width_memory.py::test_every_case_within_10_percent_and_the_median_within_5",
    # the walk-throughs beyond the first, and the launch paths CI runs once already
    "tests/integration/test_walkthroughs.py::test_chat_walkthrough_runs_as_written",
    "tests/integration/test_walkthroughs.py::test_adapter_walkthrough_runs_as_written",
    "tests/integration/test_walkthroughs.py::test_vision_walkthrough_runs_as_written",
    "tests/integration/test_walkthroughs.py::test_slow_links_walkthrough_runs_as_written",
    "tests/integration/test_walkthroughs.py::test_preference_walkthrough_runs_as_written",
    "tests/integration/test_walkthroughs.py::test_vision_language_walkthrough_runs_as_written",
    # (CI's whole run measured 47 min from a clean clone of 301a579: the reward model's walk-through, 47 s, and the
    # data cache's, 25 s, join them; grpo's stays, the measure that the toy task is learnt)
    "tests/integration/test_walkthroughs.py::test_reward_walkthrough_runs_as_written",
    "tests/integration/test_walkthroughs.py::test_data_prepare_walkthrough_runs_as_written",
    "tests/integration/test_crash_safety.py::test_sigterm_saves_at_the_step_boundary_exits_0_and_the_next_start_resumes",
    "tests/integration/test_crash_safety.py::test_a_second_start_into_a_running_run_s_output_dir_is_refused_and_touches_nothing",
    "tests/integration/test_crash_safety.py::test_torchrun_max_restarts_resumes_by_itself",
    "tests/integration/test_checkpoint_errors.py::test_a_truncated_shard_is_named",
    "tests/integration/test_checkpoint_errors.py::test_a_resume_path_that_does_not_exist",
    "tests/integration/test_checkpoint_errors.py::test_a_checkpoint_of_another_model",
    "tests/integration/test_checkpoint_errors.py::test_a_different_recipe_into_a_run_s_output_dir_is_refused_unless_asked",
    "tests/integration/test_multi_node.py",
    "tests/integration/test_deepspeed.py::test_zero_offload_trains_the_quickstart",
    "tests/integration/test_deepspeed.py::test_zero3_runs_in_one_process_without_a_launcher",
    "tests/integration/test_probe.py::test_the_docs_probe_commands_run_as_written",
    "tests/integration/test_probe.py::test_probe_over_two_ranks_writes_a_profile_the_planner_uses",
    "tests/integration/test_generate.py::test_a_lora_run_s_adapter_continues_a_prompt_on_its_base",
    "tests/integration/test_checkpoint_export.py::test_final_model_and_export_give_the_trained_logits[qwen2-untied-fsdp2]",
    "tests/integration/test_checkpoint_export.py::test_final_model_and_export_give_the_trained_logits[llama-tp2-loss_parallel]",
    "tests/integration/test_deepspeed.py::test_the_docs_deepspeed_command_runs_as_written",
    "tests/integration/test_export.py::test_the_docs_export_commands_run_as_written",
    "tests/integration/test_replica_failures.py::test_replica_groups_started_by_torchrun_as_the_docs_say",
    "tests/unit/test_planner_properties.py::test_more_memory_never_gives_a_slower_pick[llama-3-8b-64-8192-512]",
)


def tier_of(nodeid: str) -> str | None:
    """``"extended"``, ``"full"`` or None (the test's own marks decide) for a collected test's node id."""
    if any(_names(nodeid, entry) for entry in EXTENDED):
        return "extended"
    if any(_names(nodeid, entry) for entry in FULL):
        return "full"
    return None


def stale_entries(collected: Iterable[str], root: Path) -> list[str]:
    """The entries whose module is not a file under ``root`` (the repository), or names no test among ``collected``
    although their module was collected (a run of some modules judges only theirs)."""
    ids = list(collected)
    modules = {test_id.split("::", 1)[0] for test_id in ids}
    stale = []
    for entry in (*FULL, *EXTENDED):
        module = entry.split("::", 1)[0]
        if not (root / module).is_file() or (module in modules and not any(_names(i, entry) for i in ids)):
            stale.append(entry)
    return stale


def _names(nodeid: str, entry: str) -> bool:
    """``entry`` is a module, a test (all its cases) or one case."""
    if entry.endswith(".py"):
        return nodeid.startswith(entry + "::")
    return nodeid == entry or nodeid.startswith(entry + "[")
