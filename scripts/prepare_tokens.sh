#!/usr/bin/env bash
# BPE token shards of a directory of text in one command: makes .venv-test (PyPI's
# `tokenizers`, scripts/setup_python.sh) when it is missing, then runs tools/prepare_tokens.py.
# Default: the fortunes, a byte-level BPE of 4096 ids trained on their training split, into
# data/fortunes_bpe (what configs/gpt_tokens.toml trains on). Other arguments go to the script:
#   bash scripts/prepare_tokens.sh --text my_texts/ --out data/my_bpe --vocab 8192
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_python.sh
args=("$@")
case " $* " in *" --out "* | *" --out="*) ;; *) args+=(--out data/fortunes_bpe) ;; esac
exec .venv-test/bin/python tools/prepare_tokens.py "${args[@]}"
