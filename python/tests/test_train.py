"""Configs, training, plans and checkpoints from Python."""
import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import distjax as dj


def test_a_shipped_config_trains_and_its_checkpoint_loads_as_numpy(tmp_path, source_dir):
    out = tmp_path / "run"
    config = dj.load_config(str(source_dir / "configs/train_gpt.toml"), [
        "run.steps=4", "run.log_every=2", "run.eval_every=0", "run.eval_at_start=false",
        "run.eval_batches=1", "run.checkpoint_every=4", f"run.out_dir={out}",
        "model.layers=1", "model.d_model=32", "model.heads=2", "data.seq_len=16",
        "run.batch_size=4",
        # saved by two data-parallel devices with the model split over two: any mesh loads
        "distributed.enabled=true", "distributed.world_size=4",
        "distributed.tensor_parallel_size=2",
    ])
    summary = dj.train(config)
    assert summary["steps"] == 4 and '"data"=2' in summary["mesh"]
    assert np.isfinite(summary["final_metrics"]["train_loss"])
    arrays = dj.checkpoint.load(str(out / "checkpoints"))
    params = {k: v for k, v in arrays.items() if k.startswith("params/")}
    assert params and all(isinstance(v, np.ndarray) for v in params.values())
    # Global shapes, whatever the mesh: the first block's attention projection is whole.
    qkv = [v for k, v in params.items() if "attn" in k and k.endswith("kernel")]
    assert qkv and all(32 in v.shape for v in qkv)
    assert any(k.startswith("opt_state/") for k in arrays)
    assert "step" in dj.checkpoint.inspect(str(out / "checkpoints"))


def test_config_errors_name_the_file_line_and_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[run]\nsteps = \"many\"\n")
    with pytest.raises(dj.ConfigError, match=r"bad.toml:2.*run.steps"):
        dj.load_config(str(bad))
    typo = tmp_path / "typo.toml"
    typo.write_text("[run]\nstepz = 3\n")
    with pytest.raises(dj.ConfigError, match=r"typo.toml.*run.stepz.*run.steps"):
        dj.load_config(str(typo))
    with pytest.raises(dj.IoError) as e:
        dj.load_config(str(tmp_path / "missing.toml"))
    assert isinstance(e.value, OSError)


def test_plan_predicts_memory_and_communication(source_dir):
    text = dj.plan(dj.load_config(str(source_dir / "configs/plan_gpt3_175b.toml")))
    assert "parameters" in text and "optimizer" in text


INTERRUPTED = """
import sys, distjax as dj
config = dj.load_config(sys.argv[1], sys.argv[2:])
try:
    dj.train(config)
except KeyboardInterrupt as e:
    print("KeyboardInterrupt:", e, flush=True)
    sys.exit(3)
"""


def test_ctrl_c_stops_a_run_after_its_step_with_its_checkpoint(tmp_path, source_dir):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED, str(source_dir / "configs/train_gpt.toml"),
         "run.steps=100000", "run.log_every=1", "run.eval_at_start=false",
         "run.checkpoint_every=100000", f"run.out_dir={out}", "model.layers=1",
         "model.d_model=32", "model.heads=2", "data.seq_len=16", "run.batch_size=4",
         "distributed.enabled=true", "distributed.world_size=2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3, output
    assert "Stopped at step" in output and "KeyboardInterrupt: training stopped" in output
    summary = json.loads((out / "summary.json").read_text())
    assert 3 <= summary["steps"] < 100000
    last = sorted((out / "checkpoints").glob("step_*"))[-1]
    index = json.loads((last / "index.json").read_text())
    assert index["step"] == summary["steps"], (index["step"], summary["steps"])
