# Sourced by the TREC-50 probe scripts: one seed's data and warm-up record, made by the stages' own commands as
# dvc repro runs them (tracking off). Sets S (the seed's --set options) and W (its scratch folder, $OUT/s<seed>).
# Needs T (the tqc command) and OUT.
prepare_seed() {
  local seed=$1
  W=$OUT/s$seed; mkdir -p "$W"
  S=(--set data.dataset=trec50 --set seed=$seed --set tracking.enabled=false)
  $T "${S[@]}" ingest --out $W/ingested --quarantine $W/q/ingest.jsonl --report $W/r/ingest.json
  $T "${S[@]}" validate --data $W/ingested --out $W/validated --quarantine $W/q/validate.jsonl --report $W/r/validation.json --docs $W/r/docs
  $T "${S[@]}" augment --train $W/validated/train.jsonl --generated $W/validated/generated.jsonl --held-out $W/validated/validation.jsonl $W/validated/test.jsonl --catalog $W/validated/catalog.jsonl --out $W/augmented/train.jsonl --report $W/r/augment.json
  $T "${S[@]}" warmup --data $W/validated --out $W/warmup --report $W/r/warmup.json --quarantine $W/q/warmup.jsonl
}
