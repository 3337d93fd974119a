#!/usr/bin/env bash
# make demo: the bundled tiny MiniMax-M3 checkpoints through the C reference, and the
# per-layer agreement with transformers' own dumps of the same checkpoint:
#   1. m3 run    --profile fp32  vs the transformers float32 forward (hf_fp32.h5)
#   2. m3 replay --profile hf    vs the transformers bf16 forward (hf_bf16.h5), teacher-forced
#   3. m3 run --generate: greedy decode through the KV / index caches
#   4. m3 attribute: which numerics factor dominates each layer's error
#   5. m3 eval gsm8k: the trained fixtures/arith-model under fp32, mxfp4 and an fp8 KV cache
# The tables are condensed from `m3 compare` (its full report: m3 compare A.h5 B.h5).
set -euo pipefail
: "${M3:=build/m3}"
shared=${M3_SHARED:-../shared}
out=$(mktemp -d /tmp/m3-demo.XXXXXX)
trap 'rm -rf "$out"' EXIT

fixtures=()
for d in "$shared/fixtures/hf-tiny" fixtures/tiny-*; do
  [ -f "$d/model/config.json" ] && [ -f "$d/hf_fp32.h5" ] && fixtures+=("$d")
done
[ ${#fixtures[@]} -gt 0 ] || { echo "demo: no fixture found (looked in $shared/fixtures and fixtures/)" >&2; exit 2; }

"$M3" --version

# table NAME REF.h5 OURS.h5: per layer NMSE of the main stages and the set agreements
table() {
  local name=$1 a=$2 b=$3 rc=0 rep
  rep=$("$M3" compare "$a" "$b" --color never 2>&1) || rc=$?
  echo
  echo "== $name"
  echo "$rep" | awk '
    function val(key,   i) { for (i = 1; i < NF; i++) if ($i == key) return $(i + 1); return "" }
    $1 ~ /^layers\/[0-9]+\// {
      split($1, p, "/"); L = p[2]; st = p[3]; if (!(L in seen)) { seen[L] = 1; order[++n] = L }
      v = (st == "index_topk" || st == "expert_ids") ? val("agree") : val("nmse")
      if (v != "") cell[L, st] = v
      if ($3 != "ok" && $3 != "only") bad[L] = bad[L] " " st
    }
    $1 == "logits" { lg = val("nmse") }
    /top-1/ { top1 = val("top-1") }
    /^(OK|FAIL|DIFF)/ { verdict = $0 }
    END {
      printf "%-5s %10s %10s %10s %10s %10s %9s %9s  %s\n", "layer", "attn_norm", "attn_proj",
             "mlp_norm", "mlp_out", "output", "topk=", "experts=", "beyond tolerance"
      for (i = 1; i <= n; i++) {
        L = order[i]
        printf "%-5s", L
        split("attn_norm attn_proj mlp_norm mlp_out output", s, " ")
        for (j = 1; j <= 5; j++) printf " %10s", ((L, s[j]) in cell) ? cell[L, s[j]] : "-"
        printf " %9s %9s  %s\n", ((L, "index_topk") in cell) ? cell[L, "index_topk"] : "-",
               ((L, "expert_ids") in cell) ? cell[L, "expert_ids"] : "-", bad[L] == "" ? "-" : bad[L]
      }
      printf "logits NMSE %s, top-1 agreement %s\n", lg, top1
      print verdict
    }'
  echo "(columns: NMSE per stage; topk= / experts=: fraction of rows with identical sets; exit $rc)"
  return 0
}

for f in "${fixtures[@]}"; do
  echo
  echo "######## $f"
  tok="$f/tokens.txt"
  "$M3" run --model "$f/model" --tokens "$tok" --profile fp32 --dump "$out/run_fp32.h5" --force
  table "fp32 run vs transformers float32 ($f/hf_fp32.h5)" "$f/hf_fp32.h5" "$out/run_fp32.h5"
  if [ -f "$f/hf_bf16.h5" ]; then
    "$M3" replay --model "$f/model" --from "$f/hf_bf16.h5" --profile hf --dump "$out/replay_hf.h5" --force
    table "hf replay (teacher-forced) vs transformers bf16 ($f/hf_bf16.h5)" "$f/hf_bf16.h5" "$out/replay_hf.h5"
  fi
  echo
  echo "== greedy decode, 8 steps through the caches"
  "$M3" run --model "$f/model" --tokens "$tok" --generate 8
done

# 4. Where does a serving engine's error come from? m3 attribute runs the reference at the
#    fp32 baseline and with each numerics factor alone (profiles, MX experts, fp8 caches,
#    top-k reuse) and all together, teacher-forced, and names the dominant factor per layer.
f=fixtures/tiny-deep
if [ -f "$f/model/config.json" ]; then
  echo
  echo "######## m3 attribute on $f (first 48 tokens, teacher-forced)"
  "$M3" attribute --model "$f/model" --ids "$(tr -s ' \n' ' ' < "$f/tokens.txt" | cut -d' ' -f1-48)" \
    --mode forced --color never
fi

# 5. Does a variant change answers? m3 eval gsm8k on the committed trained model
#    (fixtures/arith-model, README there): 5-shot greedy generation through the caches,
#    lm-eval's strict-match / flexible-extract scoring, and the paired McNemar test per
#    variant against the first. 20 held-out items here; the README has all 300.
f=fixtures/arith-model
if [ -f "$f/config.json" ]; then
  echo
  echo "######## m3 eval gsm8k on $f (20 held-out items, fp32 vs mxfp4 vs atom + fp8 KV cache)"
  "$M3" eval gsm8k --model "$f" --data "$f/test.jsonl" --fewshot "$f/fewshot.jsonl" \
    --limit 20 --max-gen-toks 128 --threads 1 --variants fp32,mxfp4,kv-fp8
fi
