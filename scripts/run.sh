#!/usr/bin/env bash
# The main job: set everything up, build, and train the Fashion-MNIST classifier,
# writing metrics.jsonl and summary.json under runs/mnist.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD=${BUILD:-build}
# Sleeping (not spinning) OpenMP workers: on a busy 2-core machine spinning barriers
# made the run ~7x slower (measured with other builds running).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
exec "./$BUILD/train_mnist" --out runs/mnist "$@"
