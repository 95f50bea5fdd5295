#!/usr/bin/env bash
# Pre-registered probe (session 74): on TREC-50, stage one's batches of 64 hold most of the 50 classes, so stage one
# already trains against the confusable ones and stage two's mined negatives add little (docs/results.md, the stage-two
# probe). With stage one at batches of 16, does stage two gain more over stage one (validation macro-F1, mean of seeds
# 0-2), and does ADMC (the checkpoint kept after stage two) end at least as high on validation as the default's
# (82.09, 88.49, 86.49: reports/trec50-k-probe)? Only both together would make it worth scoring on test.
# $1: the temperature probe's scratch folder, whose per-seed validated data, augmented train and warm-up record are
# those dvc repro makes (made by the same commands as the K probe's).
set -euo pipefail
cd "$(dirname "$0")/.."
T=".venv/bin/tqc"
OUT="$(realpath -m "${1:-/tmp/trec50-temperature-probe}")"
source scripts/trec50_probe_data.sh  # admc_chain
for seed in 0 1 2; do
  W=$OUT/s$seed
  S=(--set data.dataset=trec50 --set seed=$seed --set tracking.enabled=false --set stage_one.batch_size=16)
  admc_chain b16 $W/augmented/train.jsonl
  rm -rf $W/stage_one-b16 $W/stage_two-b16  # the histories hold what is judged
  echo "seed $seed done $(date)"
done
