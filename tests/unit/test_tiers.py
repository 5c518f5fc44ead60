"""tests/tiers.py: which ids it marks, that its two lists do not name the same test, and that a stale entry is reported."""

from __future__ import annotations

from helpers import REPO
from tiers import EXTENDED, FULL, stale_entries, tier_of


def test_an_entry_names_its_test_its_cases_or_its_module_and_nothing_else():
    case = (
        "tests/distributed/test_classification.py::test_classifier_matches_a_plain_loop[resnet-deepspeed-zero2-accum2]"
    )
    assert tier_of(case) == "extended"
    assert tier_of(case.replace("zero2", "zero2x")) is None  # a case id is matched whole, not as a prefix
    assert (
        tier_of("tests/unit/test_auto_passes_start_up.py::test_plan_auto_chooses_what_start_up_accepts[3]")
        == "extended"
    )
    assert tier_of("tests/unit/test_auto_passes_start_up.py::test_plan_auto_chooses_what_start_up_accepts[0]") == "full"
    assert tier_of("tests/unit/test_auto_passes_start_up.py::test_plan_auto_chooses_what_start_up_accepts[10]") is None
    assert tier_of("tests/distributed/test_pipeline_memory.py::test_anything[x]") == "full"  # a module: all its tests
    assert tier_of("tests/distributed/test_pipeline_memory.pyc::test_anything") is None
    whole = "tests/distributed/test_replica_sync.py::test_a_checkpoint_resumes_on_another_number_of_replica_groups"
    assert tier_of(whole) == "extended" and tier_of(whole + "_too") is None  # a test: itself and its cases only


def test_no_test_is_named_by_both_lists_and_a_stale_entry_is_reported():
    assert not set(FULL) & set(EXTENDED)
    entry = "tests/integration/test_generate.py::test_a_lora_run_s_adapter_continues_a_prompt_on_its_base"
    other = "tests/integration/test_generate.py::test_a_folder_without_a_model_is_one_line"
    assert entry in stale_entries([other], REPO)  # its module collected, the test gone (renamed): reported
    assert entry not in stale_entries([other, entry], REPO)
    assert entry not in stale_entries(["tests/unit/test_planner.py::test_x"], REPO)  # its module not collected
    assert stale_entries([], REPO) == []  # every module the lists name exists
    assert entry in stale_entries([], REPO / "elsewhere")  # a module that is not there (moved, deleted): reported
