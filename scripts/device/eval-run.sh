#!/usr/bin/env bash
# On the GPU machine, from a bundle made by scripts/device/pack.sh (bin.tar.xz with the GPU
# build of bin/m3, lib.tar.xz): `m3 eval gsm8k` on the same model, data and variants through
# --backend gpu and --backend ref, each under a time limit, then a comparison of the two
# (per variant: accuracy, prefill / decode tokens per second, wall time; generated ids
# identical or where they first diverge). Small files into $OUT:
#   device.txt            nvidia-smi line, missing libraries
#   eval-gpu.log/.json    m3 eval's table and JSON (eval-gpu-<variant>.* when the GPU refused a
#   eval-ref.log/.json      variant of the list and the rest were run one by one)
#   samples-*.jsonl.gz    the per-item samples (prompts, ids, times), compressed
#   summary.md            the comparison (also printed)
# Usage (the bundle in .dev/<you> of the checkout the device tool sends):
#   cp scripts/device/eval-run.sh .dev/<you>/ && cd .dev/<you> && bash eval-run.sh \
#       [MODEL_DIR] [DATA_FILE] [VARIANTS] [LIMIT]
#   or from the checkout root: BUNDLE=.dev/<you> bash scripts/device/eval-run.sh ...
# MODEL_DIR: a checkpoint directory with tokenizer.json (relative paths are tried from the
#   current directory, then from the checkout root); default fixtures/arith-model when the
#   checkout has it, else `standin`: the stand-in tests/cmp_eval.c uses (fixtures/tiny-deep's
#   random weights with fixtures/tokenizer/qwen2.json; the answers are wrong, the plumbing
#   and the throughput are real).
# DATA_FILE: GSM8K-style JSONL (default fixtures/arith/test.jsonl); VARIANTS: comma list
#   (default hf); LIMIT: items (default 20).
# Environment: NUM_FEWSHOT (5), FEWSHOT (a shots file), MAX_GEN_TOKS (64), T_GPU / T_REF seconds per run (60 / 60),
#   THREADS for the ref backend (all cores), BACKENDS ("gpu ref").
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(cd "${BUNDLE:-$here}" && pwd)
root=$(cd "$bundle/../.." && pwd)
: "${OUT:=$bundle/out}"
mkdir -p "$OUT"
[ -f "$bundle/lib.tar.xz" ] && [ ! -d "$bundle/lib" ] && tar -C "$bundle" -xJf "$bundle/lib.tar.xz"
[ -f "$bundle/bin.tar.xz" ] && [ ! -d "$bundle/bin" ] && tar -C "$bundle" -xJf "$bundle/bin.tar.xz"
m3="$bundle/bin/m3"
if [ ! -x "$m3" ]; then
  echo "eval-run.sh: $m3 missing (make gpu && bash scripts/device/pack.sh DEST first)" >&2
  exit 2
fi
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# a path as given when it exists from here, else from the checkout root
find_path() {
  if [ -e "$1" ]; then (cd "$(dirname "$1")" && echo "$(pwd)/$(basename "$1")")
  elif [ -e "$root/$1" ]; then echo "$root/$1"
  else echo "$1"; fi
}
model=${1:-}
if [ -z "$model" ]; then
  if [ -f "$root/fixtures/arith-model/config.json" ]; then model=fixtures/arith-model
  else model=standin; fi
fi
if [ "$model" = standin ]; then
  model="$bundle/work/standin"
  mkdir -p "$model"
  cp "$root/fixtures/tiny-deep/model/config.json" "$root/fixtures/tiny-deep/model/model.safetensors" \
     "$model/" && cp "$root/fixtures/tokenizer/qwen2.json" "$model/tokenizer.json" || exit 2
else
  model=$(find_path "$model")
fi
data=$(find_path "${2:-fixtures/arith/test.jsonl}")
variants=${3:-hf}
limit=${4:-20}
common=(--model "$model" --data "$data" --limit "$limit" --num-fewshot "${NUM_FEWSHOT:-5}"
        --max-gen-toks "${MAX_GEN_TOKS:-64}")
# FEWSHOT=FILE: the shots' source (default: the data file itself, as m3 eval does)
[ -n "${FEWSHOT:-}" ] && common+=(--fewshot "$(find_path "$FEWSHOT")")

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  ldd "$m3" | grep -i "not found"
  echo "model $model; data $data; variants $variants; limit $limit;" \
       "num_fewshot ${NUM_FEWSHOT:-5}; max_gen_toks ${MAX_GEN_TOKS:-64}"; } \
  > "$OUT/device.txt"
rm -f "$OUT"/eval-*.log "$OUT"/eval-*.json "$OUT"/eval-*.rc "$OUT"/samples-*.jsonl \
      "$OUT"/samples-*.jsonl.gz "$OUT"/summary.md

# run BACKEND TAG SECONDS [VARIANTS]: one m3 eval, its exit status in $OUT/eval-TAG.rc
run() {
  local b=$1 tag=${2//[^A-Za-z0-9._-]/_} t=$3 v=${4:-$variants} s
  s=$(date +%s%N)
  local thr=()
  [ "$b" = ref ] && [ -n "${THREADS:-}" ] && thr=(--threads "$THREADS")
  timeout "$t" "$m3" eval gsm8k "${common[@]}" --variants "$v" --backend "$b" "${thr[@]}" \
    --samples "$OUT/samples-$tag.jsonl" --json "$OUT/eval-$tag.json" > "$OUT/eval-$tag.log" 2>&1
  local rc=$?
  echo "$rc" > "$OUT/eval-$tag.rc"
  echo "$tag: exit $rc in $(( ($(date +%s%N) - s) / 1000000 )) ms (limit $t s)" \
    | tee -a "$OUT/eval-$tag.log"
  return $rc
}

for b in ${BACKENDS:-gpu ref}; do
  if [ "$b" = gpu ]; then t=${T_GPU:-60}; else t=${T_REF:-60}; fi
  run "$b" "$b" "$t"
  rc=$?
  # a variant the backend refuses stops the whole list before anything is written: run the
  # list one by one so that the variants it does run still get their numbers
  if [ "$rc" = 2 ] && [ ! -s "$OUT/samples-$b.jsonl" ] && [[ "$variants" == *,* ]] \
     && grep -q "variant '" "$OUT/eval-$b.log"; then
    IFS=, read -ra vs <<< "$variants"
    for v in "${vs[@]}"; do run "$b" "$b-$v" "$t" "$v"; done
  fi
done

python3 - "$OUT" <<'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
rows = {}    # (backend, variant) -> {doc: sample}
walls = {}   # (backend, variant) -> (load_s, wall_s)
for path in sorted(glob.glob(os.path.join(out, "samples-*.jsonl"))):
    tag = os.path.basename(path)[len("samples-"):-len(".jsonl")]
    backend = tag.split("-")[0]
    with open(path) as f:
        lines = f.read().split("\n")
    for line in lines[1:]:
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue  # a line cut by the timeout
        rows.setdefault((d.get("backend", backend), d["variant"]), {})[d["doc_id"]] = d
for path in sorted(glob.glob(os.path.join(out, "eval-*.json"))):
    with open(path) as f:
        j = json.load(f)
    per = j["variants"] if "variants" in j else {j["variant"]: j}
    for name, v in per.items():
        g = v.get("generation", {})
        walls[(g.get("backend", "?"), name)] = (g.get("load_s"), g.get("wall_s"))

def fmt(x, p=1):
    return "-" if x is None else f"{x:.{p}f}"

lines = ["| variant | backend | items | strict | flexible | prefill tok/s | decode tok/s | load s | wall s |",
         "|---|---|---|---|---|---|---|---|---|"]
for (b, v) in sorted(rows, key=lambda k: (k[1], k[0])):
    it = rows[(b, v)].values()
    n = len(it)
    strict = sum(d["strict-match"]["exact_match"] for d in it) / n
    flex = sum(d["flexible-extract"]["exact_match"] for d in it) / n
    pre_s = sum(d["prefill_s"] for d in it)
    dec_s = sum(d["decode_s"] for d in it)
    pre = sum(d["n_prompt_tokens"] for d in it) / pre_s if pre_s > 0 else None
    dec = sum(d["n_decode"] for d in it) / dec_s if dec_s > 0 else None
    load, wall = walls.get((b, v), (None, None))
    lines.append(f"| {v} | {b} | {n} | {strict:.4f} | {flex:.4f} | {fmt(pre)} | {fmt(dec)} | "
                 f"{fmt(load, 3)} | {fmt(wall, 3)} |")
lines += ["", "ref vs gpu, per variant (items both generated; ids compared token by token):", "",
          "| variant | items | identical ids | diverged | first divergence min/median/max | strict outcome differs | decode speedup gpu/ref |",
          "|---|---|---|---|---|---|---|"]
for v in sorted({v for (_, v) in rows}):
    r, g = rows.get(("ref", v)), rows.get(("gpu", v))
    if not r or not g:
        lines.append(f"| {v} | 0 | - | - | - | - | - |")
        continue
    docs = sorted(set(r) & set(g))
    pos = []
    for doc in docs:
        a, b = r[doc]["tokens"], g[doc]["tokens"]
        k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
        if k is None and len(a) != len(b):
            k = min(len(a), len(b))
        if k is not None:
            pos.append(k)
    flips = sum(r[d]["strict-match"]["exact_match"] != g[d]["strict-match"]["exact_match"] for d in docs)
    def dec(rs):
        s = sum(rs[d]["decode_s"] for d in docs)
        return sum(rs[d]["n_decode"] for d in docs) / s if s > 0 else None
    dr, dg = dec(r), dec(g)
    sp = f"{dg / dr:.1f}x" if dr and dg else "-"
    fd = f"{min(pos)}/{int(statistics.median_low(pos))}/{max(pos)}" if pos else "-"
    lines.append(f"| {v} | {len(docs)} | {len(docs) - len(pos)} | {len(pos)} | {fd} | {flips} | {sp} |")
text = "\n".join(lines) + "\n"
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write(text)
print(text)
EOF
for f in "$OUT"/samples-*.jsonl; do [ -f "$f" ] && gzip -f "$f"; done
for f in "$OUT"/eval-*.log; do echo "== $(basename "$f")"; grep -v '^ ' "$f" | head -20; done
exit 0
