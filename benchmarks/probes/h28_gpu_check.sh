#!/usr/bin/env bash
# Issue 28, round two (branch s34-h28): one H100 run, under 5 minutes, printing the numbers that
# check this branch's changes. Run from the repository root with PYTHONPATH set:
#     PYTHONPATH=$PWD bash benchmarks/probes/h28_gpu_check.sh
# Sections (each bounded by a timeout, so a slow one cannot eat the others' time):
#  1. warm = cold: BERT inference compiled in a fresh process, then twice more on its caches; per
#     process the decisions (wrapper SHA-256s, launch grid/meta, fast/direct launcher per site), the
#     launch-path counters, build workers started, and the steady ms (CUDA events, 30 calls, median of 5).
#     Expect: "decisions equal: True" for both warm processes, build_workers 0 in the warm ones,
#     slow_calls 0, and warm steady ms within 3% of cold.
#  2. gpu_suite on tiny_hf (2-layer BertModel, hidden 64, batch 2) and mlp: eager / ember / torch.compile,
#     device peaks, TFLOP/s, peak GB, auto CUDA-graph decisions. Expect tiny_hf and mlp
#     ember >= 1.0x eager with "replay" decisions in the JSON's ember stats.
#  3. training memory, GPT-2 small b8x512 bf16 autocast: eager vs ember, peak live bytes, saved bytes,
#     cuda peak. Expect ember's cuda_peak_bytes below eager's.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
TMP=$(mktemp -d /tmp/h28_gpu_check.XXXX)
say() { echo "[h28 +$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/[gpu] /'

say "1. warm = cold (bert_infer): cold, warm, warm2"
for run in cold warm warm2; do
  limit=90; [ $run = cold ] && limit=120
  EMBER_CACHE_DIR=$TMP/ember TRITON_CACHE_DIR=$TMP/triton timeout $limit \
    python benchmarks/probes/warm_decisions.py bert_infer --device cuda --time > $TMP/dec_$run.txt 2> $TMP/dec_$run.err
  say "  $run rc=$? $(grep -c DECISIONS $TMP/dec_$run.txt) record(s)"
  tail -n 3 $TMP/dec_$run.err | sed 's/^/    stderr: /'
done
python - "$TMP" <<'EOF'
import json, os, sys
sys.path.insert(0, "benchmarks/probes")
from warm_decisions import comparable
tmp = sys.argv[1]
recs = {}
for run in ("cold", "warm", "warm2"):
    lines = [l for l in open(os.path.join(tmp, f"dec_{run}.txt")) if l.startswith("DECISIONS ")]
    if lines:
        recs[run] = json.loads(lines[-1][len("DECISIONS "):])
for run, r in recs.items():
    g = r["graphs"]
    sites = [s for x in g for s in x["launches"]]
    print(f"[warm] {run:6s} steady_ms={r.get('steady_ms')} graphs={len(g)} hits={[x['hit'] for x in g]} "
          f"sites={len(sites)} fast={sum(s['fast'] for s in sites)} "
          f"direct_launcher={sum(s.get('launcher') == 'launch' for s in sites)} launch_stats={r['launch_stats']} "
          f"build_workers={r['build_workers']} aot={r['aot']}")
if "cold" in recs:
    for run in ("warm", "warm2"):
        if run in recs:
            a, b = comparable(recs["cold"]), comparable(recs[run])
            print(f"[warm] {run} decisions equal to cold: {a == b}")
            if a != b:
                for i, (x, y) in enumerate(zip(a["graphs"], b["graphs"])):
                    if x != y:
                        print(f"[warm]   graph {i} differs: cold {json.dumps(x)[:600]}")
                        print(f"[warm]                      {run} {json.dumps(y)[:600]}")
                if a.get("launch_stats") != b.get("launch_stats"):
                    print(f"[warm]   launch_stats cold {a.get('launch_stats')} vs {run} {b.get('launch_stats')}")
            c, w = recs["cold"].get("steady_ms"), recs[run].get("steady_ms")
            if c and w:
                print(f"[warm] {run} steady {w} ms vs cold {c} ms: x{w / c:.3f}")
EOF

say "2. gpu_suite: tiny_hf, mlp (eager, ember, torch)"
timeout 140 python benchmarks/gpu_suite.py --workloads tiny_hf,mlp --compilers eager,ember,torch \
  --budget 130 --timeout 100 --out $TMP/suite.json 2>&1 | grep -v "^\s*$" | tail -n 30
python - "$TMP/suite.json" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("[suite] no JSON:", e); sys.exit(0)
print("[suite] device_peaks", d.get("device_peaks"))
for r in d["rows"]:
    keys = ("eager_ms", "ember_ms", "ember_speedup", "torch_ms", "torch_speedup", "ember_warm_ms", "ember_warm_vs_cold",
            "flops", "ember_TFLOPs", "eager_peak_GB", "ember_peak_GB", "torch_peak_GB")
    print("[suite]", r["workload"], {k: r.get(k) for k in keys})
for x in d["results"]:
    if x["compiler"].startswith("ember") and x.get("ember"):
        e = x["ember"]
        print("[suite]", x["workload"], x["compiler"], "launch", e.get("launch"), "workers", e.get("build_workers"),
              "auto", e.get("auto_cudagraphs"), "cudagraphs", e.get("cudagraphs"))
EOF

say "3. training memory: GPT-2 small b8x512, bf16 autocast, eager vs ember"
EMBER_CACHE_DIR=$TMP/ember_mem TRITON_CACHE_DIR=$TMP/triton_mem timeout 120 \
  python benchmarks/probes/train_memory.py --device cuda --preset gpt2-small --autocast 2> $TMP/mem.err | \
  python -c "
import json, sys
for l in sys.stdin:
    if l.startswith('TRAIN_MEMORY '):
        d = json.loads(l[13:])
        for m in ('eager', 'ember'):
            r = d.get(m, {})
            print('[memory]', m, {k: (round(v / 1e9, 3) if k.endswith('bytes') else v) for k, v in r.items()}, '(GB)')
        print('[memory] ratios ember/eager', {k: v for k, v in d.items() if k.endswith('over_eager')})
"
tail -n 3 $TMP/mem.err | sed 's/^/    stderr: /'
say "done"
rm -rf "$TMP"
