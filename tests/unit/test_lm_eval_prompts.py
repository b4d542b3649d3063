"""quantrack's ``--style lm-eval`` prompts are the ones lm-eval itself builds, for all 1,319 questions.

lm-eval (``lm-eval[api]``, the ``dev`` extra's pin) builds the requests of its stock ``gsm8k`` task
(tests/lm_eval_task.py: its own YAML, the dataset pointed at quantrack's shipped files) with its few-shot
seed, exactly as ``simple_evaluate`` does (``set_fewshot_seed`` then ``build_all_requests``,
lm_eval/evaluator.py:L347, lm_eval/api/task.py:L268); no server is involved. Its contexts and generation
settings must equal quantrack's prompts and payload, question by question.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quantrack.accuracy import gsm8k

lm_eval = pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def lm_eval_tasks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """lm-eval's stock gsm8k on the shipped files, as lm-eval loads it; and a copy switched to its
    ``first_n`` sampler (``fewshot_config.sampler``, lm-eval's own switch). One TaskManager: indexing lm-eval's
    task folder is the slow part."""
    from lm_eval.tasks import TaskManager

    from tests.lm_eval_task import TASK, write_task

    workdir = tmp_path_factory.mktemp("lm-eval-tasks")
    include = write_task(workdir)
    write_task(workdir, f"{TASK}_firstn")
    yaml = include / f"{TASK}_firstn.yaml"
    yaml.write_text(yaml.read_text() + "fewshot_config:\n  sampler: first_n\n")
    here = os.getcwd()
    os.chdir(workdir)  # the tasks name their data files relative to workdir
    try:
        loaded = TaskManager(include_path=str(include)).load([TASK, f"{TASK}_firstn"])["tasks"]
        yield {"default": loaded[TASK], "first_n": loaded[f"{TASK}_firstn"]}
    finally:
        os.chdir(here)


def _instances(task: Any, limit: int, seed: int = 1234) -> list[Any]:
    task.set_fewshot_seed(seed=seed)  # what simple_evaluate does before building the requests
    task.build_all_requests(limit=limit)
    return sorted(task.instances, key=lambda inst: inst.doc_id)


def _ours(n: int, sampler: str, seed: int = 1234) -> list[str]:
    data = gsm8k.load_data(5)
    ids = gsm8k.fewshot_ids(sampler, num_questions=n, num_shots=5, pool_size=len(data.train), seed=seed)
    return [gsm8k.build_prompt(gsm8k.build_fewshot([data.train[j] for j in ids[i]]), data.test[i]["question"])
            for i in range(n)]


@pytest.mark.slow
def test_all_1319_prompts_equal_lm_evals_own(lm_eval_tasks: dict[str, Any]) -> None:
    instances = _instances(lm_eval_tasks["default"], limit=1319)
    assert [inst.doc_id for inst in instances] == list(range(1319))
    theirs = [inst.args[0] for inst in instances]
    ours = _ours(1319, "lm-eval")
    assert sum(a == b for a, b in zip(theirs, ours, strict=True)) == 1319
    # and they are not vLLM's first-five prompts (0/1319: that was the bug)
    assert sum(a == b for a, b in zip(theirs, _ours(1319, "first_n"), strict=True)) == 0
    # generation settings: until = quantrack's stop strings for the style; greedy
    gen = instances[0].args[1]
    assert gen["until"] == gsm8k.stop_strings("lm-eval") and gen["temperature"] == 0.0 and gen["do_sample"] is False


def test_first_n_sampler_and_another_seed_match_too(lm_eval_tasks: dict[str, Any]) -> None:
    first_n = _instances(lm_eval_tasks["first_n"], limit=4)
    assert [inst.args[0] for inst in first_n] == _ours(4, "first_n")
    seeded = _instances(lm_eval_tasks["default"], limit=4, seed=7)
    assert [inst.args[0] for inst in seeded] == _ours(4, "lm-eval", seed=7)
    assert [inst.args[0] for inst in seeded] != _ours(4, "lm-eval")


def test_installed_lm_eval_is_the_pinned_version() -> None:
    # docs/accuracy.md states the version the styles were checked against; setup.cfg pins it
    import importlib.metadata

    cfg = (Path(__file__).resolve().parents[2] / "setup.cfg").read_text()
    assert "lm-eval[api]==0.4.13" in cfg
    assert importlib.metadata.version("lm_eval") == "0.4.13"
