"""`quantrack export skypilot`: every exported YAML loads with SkyPilot's own parser (offline)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from quantrack.errors import BadInput, NotFound
from quantrack.fleet import parse_fleet, plan_jobs
from quantrack.fleet.skypilot import (
    SKYPILOT_ACCELERATORS,
    export_skypilot,
    ray_accelerator_type,
    skypilot_accelerator,
    toml_dumps,
)
from quantrack.hardware.catalog import get_gpu, gpus
from quantrack.study import load_study

sky = pytest.importorskip("sky", reason="SkyPilot not installed (pip install 'quantrack[fleet]')")

SECRET = "s3cret-pw-7c1f"
STUDY = f"""
name = "llama3-8b-fleet"
[model]
name = "Llama-3-8B"
path = "meta-llama/Meta-Llama-3-8B-Instruct"
[engine]
kind = "vllm"
version = "0.11.0"
[gpu]
name = "H100"
[tracking]
uri = "postgresql://mlflow:{SECRET}@db.internal:5432/mlflow"
[fleet]
gpus = ["H100"]
any_of = [{{cloud = "aws", region = "us-east-1"}}, {{cloud = "gcp"}}]
[[arms]]
name = "bf16"
weights = "bf16"
[[arms]]
name = "fp8-kv"
weights = "fp8"
kv = "fp8"
quantization = "fp8"
env = {{VLLM_LOGGING_LEVEL = "INFO"}}
"""


def _study(tmp_path: Path, text: str = STUDY) -> Path:
    f = tmp_path / "study.toml"
    f.write_text(text)
    return f


def test_exported_yaml_loads_with_skypilot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    tasks = export_skypilot(load_study(_study(tmp_path)), out)
    assert [t.accelerator for t in tasks] == ["H100"]
    monkeypatch.chdir(out)  # workdir "." is the export directory
    task = sky.Task.from_yaml(str(tasks[0].yaml_path))
    resources = list(task.resources)
    assert {str(r.cloud) for r in resources} == {"AWS", "GCP"}
    assert all(r.accelerators == {"H100": 1} for r in resources)
    assert {r.region for r in resources} == {"us-east-1", None}
    # null secrets become launch-time references, not values
    assert not task.secrets
    assert {ref.name for ref in task._managed_secret_refs} == {"MLFLOW_TRACKING_URI", "HF_TOKEN"}
    assert "pip install vllm==0.11.0" in task.setup
    assert "quantrack run llama3-8b-fleet-h100.study.toml" in task.run
    assert task.envs["QUANTRACK_GPU"] == "H100-SXM"
    # `sky launch --secret NAME` fills the value at launch
    import yaml

    config = yaml.safe_load(tasks[0].yaml_path.read_text())
    with_secret = sky.Task.from_yaml_config(config, secrets_overrides=[("HF_TOKEN", "hf_x")])
    assert with_secret.secrets["HF_TOKEN"].get_secret_value() == "hf_x"


def test_no_secret_written_anywhere(tmp_path: Path) -> None:
    out = tmp_path / "out"
    tasks = export_skypilot(load_study(_study(tmp_path)), out)
    for f in out.iterdir():
        assert SECRET not in f.read_text(), f
    assert any("MLFLOW_TRACKING_URI" in n for n in tasks[0].notes)


def test_narrowed_study_is_a_valid_study(tmp_path: Path) -> None:
    tasks = export_skypilot(load_study(_study(tmp_path)), tmp_path / "out")
    narrowed = load_study(tasks[0].study_path)
    original = load_study(_study(tmp_path))
    assert narrowed.gpu.name == "H100-SXM"
    assert narrowed.arms == original.arms
    assert narrowed.tracking.uri is None
    assert [j.key for j in plan_jobs(narrowed)] == ["H100/bf16", "H100/fp8-kv"]


def test_toml_writer_round_trips() -> None:
    data = {"name": "x \"q\" ü", "n": 3, "f": 0.92, "b": True, "l": [1, 2], "t": {"a": "b", "inl": {"k": "v"}},
            "arms": [{"name": "a", "args": ["--x", "1"], "env": {"A": "1"}}, {"name": "b"}]}
    assert tomllib.loads(toml_dumps(data)) == data


def test_any_of_from_clouds_and_regions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = STUDY.replace('any_of = [{cloud = "aws", region = "us-east-1"}, {cloud = "gcp"}]',
                         'clouds = ["aws"]\nregions = ["us-east-1", "us-west-2"]\nuse_spot = true')
    tasks = export_skypilot(load_study(_study(tmp_path, text)), tmp_path / "out")
    monkeypatch.chdir(tmp_path / "out")
    task = sky.Task.from_yaml(str(tasks[0].yaml_path))
    assert {(str(r.cloud), r.region, r.use_spot) for r in task.resources} == {
        ("AWS", "us-east-1", True), ("AWS", "us-west-2", True)}


def test_every_catalog_gpu_maps_to_a_skypilot_name() -> None:
    for g in gpus():
        if g.vendor == "cpu":
            continue
        try:
            name = skypilot_accelerator(g.name)
        except BadInput as exc:
            assert "has no SkyPilot accelerator name" in str(exc)
            continue
        assert name in SKYPILOT_ACCELERATORS, g.name


def test_ray_labels_match_rays_published_names() -> None:
    accel = pytest.importorskip("ray.util.accelerators.accelerators")
    expected = {"H100": accel.NVIDIA_H100, "H100-PCIe": accel.NVIDIA_H100, "A100-80GB": accel.NVIDIA_A100,
                "A100-40GB": accel.NVIDIA_A100, "L40S": accel.NVIDIA_L40S, "L4": accel.NVIDIA_L4,
                "T4": accel.NVIDIA_TESLA_T4, "A10G": accel.NVIDIA_TESLA_A10G, "V100-32GB": accel.NVIDIA_TESLA_V100,
                "H200": accel.NVIDIA_H200, "B200": accel.NVIDIA_B200}
    for gpu, label in expected.items():
        assert ray_accelerator_type(gpu) == label, gpu


def test_h100_uses_the_multicloud_name() -> None:
    # SkyPilot's "H100-SXM" is RunPod-only (catalogs/v7/common/accelerators.csv); "H100" is everywhere
    assert skypilot_accelerator(get_gpu("H100").name) == "H100"


def test_unknown_gpu_is_the_catalog_error(tmp_path: Path) -> None:
    text = STUDY.replace('gpus = ["H100"]', 'gpus = ["H10"]')
    with pytest.raises(NotFound, match=r"unknown GPU 'H10' \(did you mean"):
        export_skypilot(load_study(_study(tmp_path, text)), tmp_path / "out")


def test_unpinned_engine_is_refused(tmp_path: Path) -> None:
    text = STUDY.replace('version = "0.11.0"\n', "")
    with pytest.raises(BadInput, match=r"\[engine\] version is required to export a vllm study"):
        export_skypilot(load_study(_study(tmp_path, text)), tmp_path / "out")


def test_unknown_fleet_key(tmp_path: Path) -> None:
    text = STUDY.replace("[fleet]\n", "[fleet]\ngpu = \"H100\"\n")
    with pytest.raises(BadInput, match=r"\[fleet\] unknown key 'gpu' \(did you mean 'gpus'\?\)"):
        parse_fleet(load_study(_study(tmp_path, text)))


def test_cli_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.cli import main

    text = STUDY.replace('version = "0.11.0"\n', "")
    with pytest.raises(SystemExit) as exc:
        main(["export", "skypilot", str(_study(tmp_path, text)), "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("quantrack: error: study file") and err.count("\n") == 1


def test_cli_writes_and_prints_launch_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.cli import main

    main(["export", "skypilot", str(_study(tmp_path)), "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert "H100-SXM -> accelerators H100" in out
    assert "--secret HF_TOKEN --secret MLFLOW_TRACKING_URI" in out
    assert SECRET not in out
