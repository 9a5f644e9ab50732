#!/usr/bin/env bash
# Serve the zero-infra default by hand: two simulated (mocker) workers and the OpenAI
# frontend on 127.0.0.1:8000, embedded discovery, nothing else to install. Ctrl-C stops
# both. `dynamoctl up recipes/local.yaml` replaces this script once the supervisor lands.
set -euo pipefail
NS=${NS:-local}
PORT=${PORT:-8000}
STATE=$(mktemp -d -t dynamoctl-local-XXXXXX)

dynamoctl worker --namespace "$NS" --discovery "embedded://$STATE" --num-workers 2 \
    --model mock-llama --block-size 16 --num-gpu-blocks 4096 --speedup-ratio 10 &
WORKER=$!
cleanup() {
    kill -TERM "$WORKER" 2>/dev/null || true
    wait "$WORKER" 2>/dev/null || true
    rm -rf "$STATE"
}
trap cleanup EXIT INT TERM

echo "[serve-local] OpenAI API on http://127.0.0.1:$PORT/v1 (model mock-llama); Ctrl-C stops"
echo "[serve-local] discovery: embedded://$STATE (dynamoctl discovery ls $NS/ --url embedded://$STATE)"
dynamoctl frontend --namespace "$NS" --discovery "embedded://$STATE" --port "$PORT"
