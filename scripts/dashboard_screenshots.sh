#!/usr/bin/env bash
# Refresh the README's dashboard screenshots from real runs: train two models, serve TensorBoard on loopback,
# photograph its tabs with headless Chromium (Debian: apt-get install chromium).
#   scripts/dashboard_screenshots.sh [DATA_DIR]       DATA_DIR holds MNIST/raw/ (default: ../shared/datasets)
set -euo pipefail
cd "$(dirname "$0")/.."
data_dir=${1:-../shared/datasets}
python=${PYTHON:-.venv/bin/python}
logs=$(mktemp -d)
profile=$(mktemp -d)

for model in SeqNet ConvNet; do
  "$python" train.py --model "$model" --data.dataset mnist --data.data_dir "$data_dir" --devices 2 \
    --trainer.accelerator cpu --trainer.max_epochs 2 --trainer.default_root_dir "$logs" \
    --trainer.enable_progress_bar false
done

port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$python" -m tensorboard.main --logdir "$logs" --host 127.0.0.1 --port "$port" 2>/dev/null &
server=$!
trap 'kill $server; rm -rf "$profile"' EXIT
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$port/data/runs" | grep -q ConvNet && break; sleep 1; done

shoot() {  # shoot NAME URL_FRAGMENT WIDTH,HEIGHT
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$profile" --hide-scrollbars \
    --window-size="$3" --virtual-time-budget=20000 --screenshot="docs/$1.png" \
    "http://127.0.0.1:$port/$2" 2>/dev/null
}
shoot opening '' 1400,1100  # the Time Series tab, as TensorBoard opens
shoot scalars '#scalars&tagFilter=%5E(train%7Cval%7Ctest)%2F(loss%7Cacc)%24' 1400,1100
shoot speed '#scalars&tagFilter=workload' 1400,1100
shoot images_tab '#images&tagFilter=confusion' 1400,1300
shoot hparams '#hparams' 2400,500
# A figure at its own size, as TensorBoard serves them (the image endpoint of the same server).
for shot in confusion_matrix:visuals/test_confusion_matrix; do
  query=$(curl -sf "http://127.0.0.1:$port/data/plugin/images/images?run=ConvNet-mnist/version_0&tag=${shot#*:}" |
    "$python" -c 'import json, sys; print(json.load(sys.stdin)[-1]["query"])')
  shoot "${shot%%:*}" "data/plugin/images/individualImage?$query" 1120,760
done
echo "Screenshots in docs/; logs of the runs in $logs"
