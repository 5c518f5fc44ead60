"""The progress bar of a run (``train/metrics.Progress``) and the lines bigtrain logs while it shows."""

from __future__ import annotations

import logging
import sys


def test_a_line_logged_while_the_bar_shows_is_its_own_line_above_the_bar(capfd):
    """A checkpoint saved mid-run says so on a line of its own: not glued to the bar's text, where the terminal
    showed "train: 100%|...| 3/3 [...]bigtrain: checkpoint: step 3 saved"."""
    from bigtrain.train.metrics import Progress

    handler = logging.StreamHandler(sys.stderr)  # as the CLI sets bigtrain's lines up (cli/_setup_logging)
    handler.setFormatter(logging.Formatter("bigtrain: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    log = logging.getLogger("bigtrain.test_progress")
    log.setLevel(logging.INFO)
    try:
        progress = Progress(total=3, initial=0, enabled=True)
        for step in range(3):
            progress.update({"loss": 1.0, "tokens_per_s": 100.0})
            if step == 1:
                log.info("checkpoint: step 2 saved to /tmp/x")
        progress.close()
    finally:
        root.removeHandler(handler)
    err = capfd.readouterr().err
    (line,) = [line for line in err.split("\n") if "checkpoint: step 2 saved" in line]
    assert line.rsplit("\r", 1)[-1] == "bigtrain: checkpoint: step 2 saved to /tmp/x", repr(line)
    assert err.count("checkpoint: step 2 saved") == 1


def test_the_bar_shows_the_job_s_main_metrics_and_keeps_the_latest(capfd):
    """A classifier's accuracy and macro-F1 and a preference objective's reward accuracy and margins show in the
    bar (and ``latest`` feeds the last line), not only in metrics.jsonl."""
    from bigtrain.job import Job
    from bigtrain.objectives import objective
    from bigtrain.tasks import task
    from bigtrain.train.metrics import Progress

    classifier = Job(task("image-classification"), objective("classification"))
    assert classifier.shown_metrics == ("eval_accuracy", "eval_top5_accuracy", "eval_macro_f1")
    dpo = Job(task("causal-lm"), objective("dpo"))
    assert dpo.shown_metrics[:4] == (
        "rewards/accuracies", "rewards/margins", "eval_rewards/accuracies", "eval_rewards/margins"
    )  # fmt: skip
    progress = Progress(total=2, initial=0, enabled=True, unit="pairs", shown=dpo.shown_metrics)
    progress.update({"loss": 0.69, "pairs_per_s": 10.0, "rewards/accuracies": 0.5, "rewards/margins": 0.01})
    progress.update({"loss": 0.6, "pairs_per_s": 10.0, "rewards/accuracies": 0.75, "eval_loss": 0.65,
                     "eval_rewards/accuracies": 0.625, "logps/chosen": -3.0})  # fmt: skip
    progress.close()
    assert progress.latest == {
        "eval_loss": 0.65, "rewards/accuracies": 0.75, "rewards/margins": 0.01, "eval_rewards/accuracies": 0.625
    }  # fmt: skip
    err = capfd.readouterr().err
    assert "rewards/accuracies=0.75" in err and "eval_rewards/accuracies=0.625" in err and "logps" not in err
