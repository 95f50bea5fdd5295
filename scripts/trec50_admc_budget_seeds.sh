#!/usr/bin/env bash
# Pre-registered (session 88, 2026-12-04), committed before part 2 of scripts/trec50_budget_probe.sh (ADMC at 4 / 2,
# seed 0) had finished: to be run only if that part passes its rule (ADMC's kept validation macro-F1 at least 1 point
# over the default's 82.09 at seed 0).
# ADMC at stage_one.epochs=4, stage_two.epochs=2, seeds 1-4, NC off, by the stages' own commands; each seed's data,
# warm-up record and NC at 6 epochs (the same doubled budget) are the budget probe's, in $OUT/s<seed>.
# Judged: the mean over seeds 0-4 of ADMC's validation macro-F1 at the checkpoint it keeps, against the default's
# (82.09, 88.49, 86.49, 86.62, 88.81: prior_shift.admc.validation_unshifted in reports/trec50-9b77167). Test figures
# (scripts/rescore.py, no class-prior shift) are recorded and choose nothing. Whatever the outcome, no default changes
# in this session: the default run's budget is set by make run's time on TREC-6. If the mean gains at least 1 point,
# README reports TREC-50 at 4 / 2 beside the default budget's row, with NC at 6 epochs (the same passes) beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
T=".venv/bin/tqc"
OUT="$(realpath -m "${1:-/tmp/trec50-nc-protocol-probe}")"
for seed in ${SEEDS:-1 2 3 4}; do
  W=$OUT/s$seed
  S=(--set data.dataset=trec50 --set seed=$seed --set tracking.enabled=false --set stage_one.epochs=4 --set stage_two.epochs=2)
  $T "${S[@]}" stage-one --data $W/validated --train $W/augmented/train.jsonl --warmup $W/warmup --out $W/stage_one-4 --history $W/stage_one-4.csv
  $T "${S[@]}" mine --data $W/validated --train $W/augmented/train.jsonl --model $W/stage_one-4 --out $W/negatives-4.jsonl --report $W/r/mining-4.json
  $T "${S[@]}" stage-two --data $W/validated --train $W/augmented/train.jsonl --negatives $W/negatives-4.jsonl --model $W/stage_one-4 --out $W/stage_two-2 --history $W/stage_two-2.csv
  .venv/bin/python scripts/rescore.py --data $W/validated --stage-one $W/stage_one-4 --stage-two $W/stage_two-2 --nc $W/nc-E --set data.dataset=trec50 --set seed=$seed > $OUT/rescore-admc-4-2-s$seed.txt
  echo "ADMC 4/2 seed $seed done $(date)"
done
