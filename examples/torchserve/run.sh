#!/usr/bin/env bash
# Serve a model compiled by ember with TorchServe, load-test it against eager, stop the server.
#
#   examples/torchserve/run.sh [--requests N] [--clients C] [--variants "eager ember openvino"]
#                              [--work DIR] [--report FILE] [--port BASE] [--no-install]
#
# 1. installs what is missing (unless --no-install): Java 17 (install_java.sh, from the distribution's
#    packages), torchserve and torch-model-archiver 0.12.0, ember itself (this checkout), openvino
#    when the openvino variant is asked for;
# 2. builds one .mar per variant (build.py): the same weights and handler (ember_handler.py), served
#    eagerly ("eager"), compiled by ember's native backend ("ember") or by its OpenVINO backend;
# 3. starts TorchServe on 127.0.0.1 (ports BASE, BASE+1, BASE+2; default 18080) with token
#    authorization off and the model API on (both explicit: this is a local test server), and
#    registers each model through the management API;
# 4. runs client.py: N requests from C concurrent clients per model, every answer checked against
#    eager PyTorch, bad requests checked for clear 400 answers; prints p50/p99 latency and throughput;
# 5. stops the server, whatever happened (trap).
# Exit status: client.py's (0 when every check passed).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-python3}"
REQUESTS=1000
CLIENTS=8
VARIANTS="eager ember openvino"
WORK=""
REPORT=""
PORT=18080
INSTALL=1
while [ $# -gt 0 ]; do
    case "$1" in
        --requests) REQUESTS="$2"; shift 2 ;;
        --clients) CLIENTS="$2"; shift 2 ;;
        --variants) VARIANTS="$2"; shift 2 ;;
        --work) WORK="$2"; shift 2 ;;
        --report) REPORT="$2"; shift 2 ;;
        --port) PORT="$2"; shift 2 ;;
        --no-install) INSTALL=0; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$WORK" ] || WORK="$(mktemp -d -t ember-torchserve.XXXXXX)"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
[ -n "$REPORT" ] || REPORT="$WORK/report.json"
# the worker processes import ember and the handler's modules: this checkout's ember first
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

# -- 1. install ------------------------------------------------------------------------------
need_py() { "$PY" -c "import $1" >/dev/null 2>&1; }
if [ "$INSTALL" = 1 ]; then
    bash "$HERE/install_java.sh"
    if ! need_py ts || ! need_py model_archiver || ! command -v torchserve >/dev/null; then
        "$PY" -m pip install -q "torchserve==0.12.0" "torch-model-archiver==0.12.0"
    fi
    need_py ember || "$PY" -m pip install -q -e "$REPO"
    case " $VARIANTS " in *" openvino "*) need_py openvino || "$PY" -m pip install -q -e "$REPO[openvino]" ;; esac
    need_py requests || "$PY" -m pip install -q requests
fi
for tool in java torchserve torch-model-archiver; do
    command -v "$tool" >/dev/null || { echo "run.sh: $tool not found (run without --no-install to install it)" >&2; exit 1; }
done

# -- 2. build ---------------------------------------------------------------------------------
"$PY" "$HERE/build.py" --out "$WORK" --variants $VARIANTS

# -- 3. start and register --------------------------------------------------------------------
INFER="http://127.0.0.1:$PORT"
MANAGE="http://127.0.0.1:$((PORT + 1))"
cat > "$WORK/config.properties" <<EOF
inference_address=$INFER
management_address=$MANAGE
metrics_address=http://127.0.0.1:$((PORT + 2))
# a local test server: no token authorization (TorchServe 0.12 turns it on by default), and the
# management API may register models (off by default)
disable_token_authorization=true
enable_model_api=true
default_workers_per_model=1
EOF
# TorchServe writes its pid file to \$TMPDIR and its logs to ./logs: keep both in WORK, so that
# --stop stops this server and no other
export TMPDIR="$WORK"
cd "$WORK"
stop() {
    local pid
    pid="$(cat "$WORK/.model_server.pid" 2>/dev/null || true)"
    torchserve --stop >/dev/null 2>&1 || true
    # --stop signals the frontend, which then stops its workers: wait until it is gone
    for _ in $(seq 60); do
        [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        echo "run.sh: TorchServe (pid $pid) did not stop; killing it" >&2
        kill -9 "$pid" 2>/dev/null || true
    fi
}
trap stop EXIT
trap 'exit 130' INT TERM  # exit, which runs the EXIT trap
torchserve --start --ncs --model-store "$WORK/model_store" --ts-config "$WORK/config.properties" \
    --disable-token-auth --enable-model-api > "$WORK/torchserve.out" 2>&1 || {
    echo "run.sh: torchserve did not start; see $WORK/torchserve.out" >&2; exit 1; }
for _ in $(seq 120); do
    curl -sf "$INFER/ping" >/dev/null 2>&1 && break
    sleep 0.5
done
curl -sf "$INFER/ping" >/dev/null || { echo "run.sh: TorchServe is not answering on $INFER; logs in $WORK/logs" >&2; exit 1; }
MODELS=""
for v in $VARIANTS; do
    name="tinynet_$v"
    # synchronous: the answer comes once the worker is up, i.e. after the handler compiled the model
    code=$(curl -s -o "$WORK/register-$v.json" -w '%{http_code}' -X POST \
        "$MANAGE/models?url=$name.mar&initial_workers=1&synchronous=true")
    if [ "$code" != 200 ]; then
        echo "run.sh: registering $name answered HTTP $code: $(cat "$WORK/register-$v.json")" >&2
        tail -n 30 "$WORK/logs/model_log.log" >&2 || true
        exit 1
    fi
    MODELS="$MODELS $name"
done
echo "TorchServe on $INFER serves:$MODELS (work directory $WORK)"

# -- 4. load test -----------------------------------------------------------------------------
"$PY" "$HERE/client.py" --url "$INFER" --weights "$WORK/weights.pth" --models $MODELS \
    --requests "$REQUESTS" --clients "$CLIENTS" --report "$REPORT"
