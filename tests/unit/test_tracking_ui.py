"""What a user sees of the store: MLflow's INFO lines stay off quantrack's output, and experiments open in
MLflow 3's model-training view (the runs list), not its GenAI view."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_fresh_store_prints_no_mlflow_info_and_tags_the_experiment_kind(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = ("from quantrack.store import tracking as t\n"
            f"c = t._client({uri!r})\n"
            f"t.experiment_id(c, 'exp', {uri!r})\n"
            "print(c.get_experiment_by_name('exp').tags.get('mlflow.experimentKind'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "custom_model_development"
    assert "INFO" not in out.stderr and "Creating initial MLflow database tables" not in out.stderr


def test_an_existing_experiment_without_the_kind_gets_it(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from quantrack.store import tracking as t

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(tracking_uri=uri).create_experiment("old")  # made before quantrack tagged experiments
    c = t._client(uri)
    t.experiment_id(c, "old", uri)
    assert c.get_experiment_by_name("old").tags["mlflow.experimentKind"] == "custom_model_development"
