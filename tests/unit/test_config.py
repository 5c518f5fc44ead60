import re

import pytest
from helpers import REPO, check_fit

from bigtrain.config.load import load_recipe
from bigtrain.config.resolve import parallel_of, resolve_plan
from bigtrain.errors import ConfigError
from bigtrain.models.build import load_hf_config


def write(tmp_path, text):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    return p


def test_defaults_and_overrides(tmp_path):
    cfg = load_recipe(
        write(tmp_path, "train:\n  steps: 5\n"), ["train.lr=3e-4", "parallel.backend=ddp", "data.shuffle=false"]
    )
    assert cfg.train.steps == 5
    assert cfg.train.lr == pytest.approx(3e-4)  # '3e-4' is a string to PyYAML; the schema makes it a float
    assert cfg.parallel.backend == "ddp"
    assert cfg.data.shuffle is False
    assert cfg.parallel.dp_shard is None


def test_model_config_is_a_free_dict(tmp_path):
    cfg = load_recipe(write(tmp_path, "model:\n  config: {model_type: llama, hidden_size: 32}\n"))
    assert cfg.model.config == {"model_type": "llama", "hidden_size": 32}


@pytest.mark.parametrize(
    "text, overrides, expected",
    [
        ("train:\n  stepz: 5\n", [], "unknown recipe key train.stepz; did you mean train.steps?"),
        ("trian: {}\n", [], "unknown recipe key trian; did you mean train?"),
        ("", ["parallel.bogus=1"], "unknown recipe key parallel.bogus"),
        ("train:\n  steps: ten\n", [], "train.steps='ten' must be an integer"),
        ("train:\n  lr: fast\n", [], "train.lr='fast' must be a number"),
        ("data:\n  shuffle: 3\n", [], "data.shuffle=3 must be true or false"),
        (
            "train:\n  mixed_precision: fp8\n",
            [],
            "train.mixed_precision='fp8' is not allowed; use one of: fp32, bf16, fp16",
        ),
        ("train: 3\n", [], "train must be a mapping"),
        ("- a\n- b\n", [], "must be a mapping of sections"),
        ("", ["train.steps"], "must look like key.sub=value"),
        ("train:\n  steps: 0\n", [], "train.steps=0 must be at least 1"),
        ("train:\n  warmup_steps: -1\n", [], "train.warmup_steps=-1 must be at least 0"),
    ],
)
def test_bad_recipes_name_the_key(tmp_path, text, overrides, expected):
    with pytest.raises(ConfigError) as e:
        load_recipe(write(tmp_path, text), overrides)
    assert expected in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_recipe_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_recipe(tmp_path / "nope.yaml")


@pytest.mark.parametrize("recipe", sorted(p.name for p in (REPO / "recipes").glob("*.yaml")))
def test_no_shipped_recipe_needs_what_the_readme_s_install_leaves_out(recipe):
    """The README's install (``pip install -e .``) runs every shipped recipe: a tracker (``train.log_to``) is an
    extra a user adds with ``--set``, not a step of a walk-through that then fails on a fresh machine."""
    import tomllib

    from bigtrain.train.trackers import PACKAGES

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[<>=!~\[ ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    log_to = load_recipe(REPO / "recipes" / recipe).train.log_to  # jsonl: metrics.jsonl alone, no package
    needs = PACKAGES[log_to][1].split() if log_to in PACKAGES else []
    assert all(n in base for n in needs), f"{recipe}: train.log_to={log_to} needs {needs}, an extra"


@pytest.mark.parametrize("recipe", sorted(p.name for p in (REPO / "recipes").glob("*.yaml")))
def test_every_shipped_recipe_resolves_for_the_workers_its_header_names(recipe):
    """Each recipe's header says how to run it (``--nproc N``); its plan must resolve for N ranks and split its
    model (tensor parallelism) as written."""
    text = (REPO / "recipes" / recipe).read_text()
    nproc = int(m.group(1)) if (m := re.search(r"--nproc (\d+)", text)) else 1
    cfg = load_recipe(REPO / "recipes" / recipe)
    parallel = cfg.parallel
    if parallel.plan == "auto":  # the plan the search chooses for N ranks, resolved as if the user had written it
        import bigtrain

        parallel = parallel_of(bigtrain.recipe_plan(REPO / "recipes" / recipe, gpus=nproc).plan.to_dict())
    plan = resolve_plan(parallel, nproc, cfg.train)
    assert plan.world_size == nproc
    if cfg.model.config is not None:  # the model's task resolved as start-up resolves it
        check_fit(load_hf_config(cfg.model), plan, cfg.train.global_batch_size, cfg.model)
