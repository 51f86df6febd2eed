#!/usr/bin/env bash
# The main job: set everything up, build, and train the GPT on the fortunes text corpus
# on a ("data"=2, "model"=2, "pipe"=2) mesh of 8 simulated devices (configs/gpt_3d.toml:
# data parallel x Megatron tensor parallel x a 1F1B pipeline), with a progress bar. It
# ends by printing where the summary, the loss curve, the checkpoint and the timeline are
# (runs/gpt_3d/). Extra arguments go to `distjax train`, e.g. --set run.steps=200 or
# --resume. Each run starts afresh: it passes --overwrite, which removes the checkpoints
# of an earlier run in runs/gpt_3d/checkpoints, unless the arguments ask to resume
# (--resume, --resume=auto, run.resume) or already say --overwrite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD=${BUILD:-build}
# Sleeping (not spinning) OpenMP workers: on a busy 2-core machine spinning barriers
# made the run ~7x slower (measured with other builds running).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
fresh=(--overwrite)
for arg in "$@"; do
  case "$arg" in
    --resume | --resume=true | --resume=auto | --overwrite | *run.resume=true | *run.resume=*auto*)
      fresh=() ;;
  esac
done
exec "./$BUILD/distjax" train configs/gpt_3d.toml "${fresh[@]}" "$@"
