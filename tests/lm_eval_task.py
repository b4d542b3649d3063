"""lm-eval's stock ``gsm8k`` task on quantrack's shipped GSM8K files, without the HF hub.

lm-eval reads a task YAML from ``--include_path DIR`` (``TaskManager(include_path=...)`` in Python). This
one is the stock ``lm_eval/tasks/gsm8k/gsm8k.yaml`` pulled in with ``include:``, so the prompt, exemplar
sampler, stop strings, filters and metric are lm-eval's own; only the dataset keys are replaced
(``dataset_path: json`` + ``dataset_kwargs.data_files``: the ``datasets`` JSON builder reads local
files, so nothing is fetched). The data files are linked into ``workdir/data`` and named relative to it,
so lm-eval run with ``cwd=workdir`` writes no machine path into its results file.
"""

from __future__ import annotations

from pathlib import Path

TASK = "gsm8k_local"


def write_task(workdir: Path, name: str = TASK) -> Path:
    """Write ``workdir/tasks/<name>.yaml`` (+ ``workdir/data`` links); returns the include dir."""
    import lm_eval

    from quantrack.resources import data_dir

    stock = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        link = data / f"{split}.jsonl"
        if not link.exists():
            link.symlink_to(data_dir() / "gsm8k" / f"{split}.jsonl")
    tasks = workdir / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    (tasks / f"{name}.yaml").write_text(
        f"include: {stock}\n"
        f"task: {name}\n"
        "dataset_path: json\n"
        "dataset_name: null\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        "    train: data/train.jsonl\n"
        "    test: data/test.jsonl\n"
        "  cache_dir: hf-datasets\n", encoding="utf-8")
    return tasks
