"""distjax.train: a config's training run, as `distjax train` does it."""

import json
import os

from . import _distjax


def train(config, *, show_schedule=False, show_sharding=False):
    """Trains `config` (distjax.load_config / builtin_config) with the progress line on the
    terminal, and returns the run's summary (summary.json, as a dict; None when
    run.out_dir is empty). Raises ConfigError naming the key for a config it refuses."""
    status = _distjax._train(config, show_schedule=show_schedule, show_sharding=show_sharding)
    if status != 0:
        raise _distjax.Error(f"[train] the run ended with status {status}")
    path = os.path.join(config.out_dir, "summary.json") if config.out_dir else None
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return None
