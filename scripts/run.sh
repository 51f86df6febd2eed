#!/usr/bin/env bash
# The main job: set everything up, build, and train the Fashion-MNIST classifier,
# writing metrics.jsonl and summary.json under runs/mnist.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD=${BUILD:-build}
exec "./$BUILD/train_mnist" --out runs/mnist "$@"
