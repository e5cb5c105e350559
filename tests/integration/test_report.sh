#!/usr/bin/env bash
# ddptrain --task report in a real browser: a short 2-rank run (MLP, evaluations, a log line
# every 5 steps), the report made from its metrics.jsonl alone, checked to be self-contained (no
# script, stylesheet, font or image to fetch), then rendered by headless Chromium into a
# screenshot whose pixels check_report_png.py checks: not blank, every chart drawn where the page
# says, every curve's colour inside its chart's plot area. The checker must also reject the same
# screenshot when a chart claims a colour it does not show. Skipped (77) without chromium
# (Debian's `chromium`, in scripts/install-deps.sh). Also: a language model's report (no
# accuracy chart), and the errors of a run directory without metrics.
. "$(dirname "$0")/lib.sh"
TRAIN=$BIN/ddptrain
SRC=$(cd "$(dirname "$0")/../.." && pwd)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cd "$T"

"$TRAIN" --task report --out_dir nothing >none.out 2>&1 && fail "a report without metrics succeeded"
assert_contains none.out "cannot read 'nothing/metrics.jsonl'"
mkdir -p empty && echo '{"step": 0, "start": true}' >empty/metrics.jsonl
"$TRAIN" --task report --out_dir empty >empty.out 2>&1 && fail "a report without progress lines succeeded"
assert_contains empty.out "holds no training progress line"
ok "a run directory without metrics is a clear error"

# A run trained on 2 ranks and resumed on 1 (a documented resume): both ranks' curves, and the
# header says the world changed (before 2026-11-25: "1 rank", rank 0 "slowest in 100%").
mkdir -p worlds
{
    echo '{"step": 0, "start": true, "world_size": 2, "peak_flops_per_rank": 1e10, "model": "mlp"}'
    echo '{"step": 10, "loss": 2.0, "lr": 0.1, "samples_per_s": 1000, "mfu": 0.1, "rank_step_ms": [9, 9], "rank_wait_ms": [1, 5]}'
    echo '{"step": 20, "loss": 1.5, "lr": 0.1, "samples_per_s": 1000, "mfu": 0.1, "rank_step_ms": [9, 9], "rank_wait_ms": [5, 1]}'
    echo '{"step": 20, "start": true, "world_size": 1, "peak_flops_per_rank": 1e10, "model": "mlp"}'
    echo '{"step": 30, "loss": 1.2, "lr": 0.1, "samples_per_s": 500, "mfu": 0.1, "rank_step_ms": [8], "rank_wait_ms": [0]}'
    echo '{"step": 40, "loss": 1.0, "lr": 0.1, "samples_per_s": 500, "mfu": 0.1, "rank_step_ms": [8], "rank_wait_ms": [0]}'
} >worlds/metrics.jsonl
"$TRAIN" --task report --out_dir worlds >worlds.out 2>&1 || { cat worlds.out; fail "report failed"; }
assert_contains worlds.out "4 progress lines, 0 evaluations, 1–2 ranks"
assert_contains worlds/report.html "1–2 ranks"
assert_contains worlds/report.html "rank 0: slowest in 75% of intervals"
assert_contains worlds/report.html "rank 1: slowest in 25% of intervals"
ok "a run resumed with fewer ranks: every rank that trained is charted"

# One of each: singular words (before 2026-11-25 "1 progress lines, 1 evaluations").
mkdir -p one
{
    echo '{"step": 0, "start": true, "world_size": 1, "model": "mlp"}'
    echo '{"step": 10, "loss": 2.0, "lr": 0.1, "samples_per_s": 1000, "rank_step_ms": [9], "rank_wait_ms": [0]}'
    echo '{"step": 10, "test_loss": 1.9, "test_accuracy": 0.5}'
} >one/metrics.jsonl
"$TRAIN" --task report --out_dir one >one.out 2>&1 || { cat one.out; fail "report of one line failed"; }
assert_contains one.out "wrote one/report.html: 1 progress line, 1 evaluation, 1 rank, 0 straggler warnings"
ok "a report of one progress line and one evaluation: singular words"

# Made again: the page keeps the mode given to it (0644 until 2026-11-27), and the temporary file
# of a report killed before (a pid now gone) is removed.
chmod 600 one/report.html
dead=$(sh -c 'echo $$')
touch "one/report.html.tmp.$dead"
"$TRAIN" --task report --out_dir one >one2.out 2>&1 || { cat one2.out; fail "report made again failed"; }
[ "$(stat -c %a one/report.html)" = 600 ] || fail "report.html rewritten with mode $(stat -c %a one/report.html), want 600"
[ ! -e "one/report.html.tmp.$dead" ] || fail "a killed report's temporary file is left"
ok "a report made again: its mode kept, a killed report's temporary file removed"

"$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --total_steps 120 --log_every 5 --eval_every 30 \
    --out_dir run >train.out 2>&1 || { cat train.out; fail "training failed"; }
"$TRAIN" --task report --out_dir run >report.out 2>&1 || { cat report.out; fail "report failed"; }
assert_contains report.out "wrote run/report.html: 24 progress lines, 4 evaluations, 2 ranks"
page=run/report.html
for bad in '<script' '<link' '<img' '<iframe' 'url(' '@import' 'src='; do
    assert_not_contains $page "$bad"
done
[ "$(grep -o 'https\?://[^"]*' $page | sort -u)" = "http://www.w3.org/2000/svg" ] ||
    fail "the page names an address other than the SVG namespace: $(grep -o 'https\?://[^"]*' $page | sort -u)"
[ "$(grep -c '<svg' $page)" -eq 8 ] || fail "$(grep -c '<svg' $page) charts, want 8"
for title in Loss "Test accuracy" "Learning rate" Throughput MFU "Gradient norm" \
    "Memory (the most on any rank)" "Work per step by rank"; do
    assert_contains $page ">$title"
done
assert_not_contains $page "in use on the fullest GPU" # a CPU run: the host's memory only
ok "the report is one self-contained file with its 8 charts"
# A GPU run's lines: its memory chart has both curves; a run from before the memory figures
# (worlds, above) has no memory chart.
mkdir -p gpumem
{
    echo '{"step": 0, "start": true, "world_size": 2, "peak_flops_per_rank": 1e15, "model": "gpt"}'
    echo '{"step": 10, "loss": 2.0, "lr": 0.1, "tokens_per_s": 1000, "mfu": 0.1, "rank_step_ms": [9, 9], "rank_wait_ms": [1, 5], "rank_peak_rss_mib": [500.5, 560.1], "rank_gpu_mem_mib": [5336.78, 5336.78]}'
    echo '{"step": 20, "loss": 1.5, "lr": 0.1, "tokens_per_s": 1000, "mfu": 0.1, "rank_step_ms": [9, 9], "rank_wait_ms": [5, 1], "rank_peak_rss_mib": [501.5, 561.1], "rank_gpu_mem_mib": [5336.78, 5400.0]}'
} >gpumem/metrics.jsonl
"$TRAIN" --task report --out_dir gpumem >gpumem.out 2>&1 || { cat gpumem.out; fail "report failed"; }
assert_contains gpumem/report.html ">Memory (the most on any rank)"
assert_contains gpumem/report.html "in use on the fullest GPU"
assert_not_contains worlds/report.html "Memory (the most on any rank)"
# A rank whose device did not answer: null in metrics.jsonl (-1.000 in older files); no point
# for it, the others' largest charted; a line where no rank's is known gives no point at all.
mkdir -p gpunull
{
    echo '{"step": 0, "start": true, "world_size": 2, "peak_flops_per_rank": 1e15, "model": "gpt"}'
    echo '{"step": 10, "loss": 2.0, "lr": 0.1, "tokens_per_s": 1000, "mfu": 0.1, "rank_step_ms": [9, 9], "rank_wait_ms": [1, 5], "rank_peak_rss_mib": [500.5, 560.1], "rank_gpu_mem_mib": [5336.78, null]}'
    echo '{"step": 20, "loss": 1.5, "lr": 0.1, "tokens_per_s": 1000, "mfu": 0.1, "rank_step_ms": [9, 9], "rank_wait_ms": [5, 1], "rank_peak_rss_mib": [501.5, 561.1], "rank_gpu_mem_mib": [-1.000, -1.000]}'
} >gpunull/metrics.jsonl
"$TRAIN" --task report --out_dir gpunull >gpunull.out 2>&1 || { cat gpunull.out; fail "report failed"; }
assert_contains gpunull/report.html "in use on the fullest GPU"
python3 - gpunull/report.html <<'EOP' || fail "the memory chart plots an unknown GPU figure"
import re, sys
page = open(sys.argv[1]).read()
svg = page[page.index(">Memory (the most on any rank)"):]
svg = svg[:svg.index("</svg>")]
ticks = re.findall(r'text-anchor="end">([^<]*)<', svg)  # the y axis's labels
print("memory chart, y axis:", ticks)
sys.exit(0 if ticks and not any(t.startswith(("-", "\u2212")) for t in ticks) else 1)
EOP
ok "memory: the largest rank's peak RSS and GPU memory charted; none for a run without them"

# The screenshot and its pixels: in the plain build only. The page was made above by this
# build's ddptrain, sanitized or not; what is left is Chromium's drawing and the Python pixel
# check (10 s of CPU, its PNG decoding), neither of them code a sanitizer looks into.
if [ -n "$SANITIZE" ]; then
    echo "skip: the Chromium screenshot under $SANITIZE (the plain build checks it)"
else
    if ! command -v chromium >/dev/null; then
        echo "SKIP: no chromium (scripts/install-deps.sh installs Debian's)"
        exit 77
    fi
    # --no-sandbox: Chromium refuses to run as root (CI, containers) with its sandbox on.
    timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --user-data-dir="$T/chromium" --screenshot="$T/shot.png" --window-size=1220,2100 \
        "file://$T/$page" >chromium.out 2>&1 || { cat chromium.out; fail "chromium failed"; }
    [ -s shot.png ] || { cat chromium.out; fail "no screenshot"; }
    python3 "$SRC/tests/integration/check_report_png.py" shot.png $page ||
        fail "the screenshot does not show the charts"
    ok "headless Chromium draws every chart, with every curve's colour in its plot area"
    sed 's/data-colors="#2ca02c"/data-colors="#00ff00"/' $page >wrong.html
    python3 "$SRC/tests/integration/check_report_png.py" shot.png wrong.html >wrong.out 2>&1 &&
        fail "the checker accepted a colour the screenshot does not show"
    assert_contains wrong.out "curve colour #00ff00"
    ok "the checker rejects a chart whose colour is not on screen"
fi

# A language model's report: tokens/s, validation loss from step 0, no accuracy chart.
awk 'BEGIN { srand(3); split("the a cat dog sat ran on mat", w, " ");
             for (d = 0; d < 400; d++) { s = ""; for (i = 0; i < 15; i++) s = s w[1 + int(rand() * 8)] " ";
                 print s "\n%" } }' >text.txt
DDP_DATA_CACHE=$T/cache "$DDPRUN" --standalone --nproc_per_node=2 "$TRAIN" --model.type gpt \
    --data.text text.txt --data.doc_sep % --model.n_layer 1 --model.n_head 2 --model.n_embd 32 \
    --model.block_size 16 --batch_size 4 --optimizer adamw --lr 3e-3 --eval_windows 8 \
    --max_new_tokens 0 --total_steps 12 --log_every 2 --eval_every 6 --out_dir gpt >gpt.out 2>&1 ||
    { cat gpt.out; fail "gpt training failed"; }
"$TRAIN" --task report --out_dir gpt >gpt_report.out 2>&1 || { cat gpt_report.out; fail "gpt report"; }
assert_contains gpt_report.out "6 progress lines, 3 evaluations"
assert_contains gpt/report.html "tokens/s"
assert_not_contains gpt/report.html ">Test accuracy"
[ "$(grep -c '<svg' gpt/report.html)" -eq 7 ] || fail "gpt: $(grep -c '<svg' gpt/report.html) charts, want 7"
ok "a language model's report: tokens/s, validation loss, no accuracy chart"
