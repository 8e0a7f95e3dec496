#!/usr/bin/env bash
# A cluster of NODES "nodes" on this machine, for development and tests: each node runs the same train.py command
# with DEVICES processes on CPU (gloo) over loopback, as the nodes of a real cluster would.
#
#   scripts/local_cluster.sh NODES DEVICES -- [train.py arguments]
#   LAUNCHER=torchrun scripts/local_cluster.sh 2 2 -- --trainer.max_epochs 1
#
# LAUNCHER=lightning (default): every node gets MASTER_ADDR, MASTER_PORT and its NODE_RANK, and Lightning's launcher
# starts the node's processes. LAUNCHER=torchrun: every node runs torchrun with c10d rendezvous at MASTER_ADDR:PORT,
# restarting the job up to MAX_RESTARTS times (default 0) when a process fails. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1:
# torch's shared rendezvous store keeps the last attempt's addresses, and a restarted job fails to connect (torch
# issue #135712).
# Waits for all nodes; when one fails, ends every process of every node and exits with that node's status.
set -uo pipefail
cd "$(dirname "$0")/.."
nodes=$1 devices=$2
shift 2
[ "${1:-}" = "--" ] && shift
python=${PYTHON:-python}
launcher=${LAUNCHER:-lightning}
addr=127.0.0.1
port=${MASTER_PORT:-$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}

pids=()
for ((node = 0; node < nodes; node++)); do
  if [ "$launcher" = torchrun ]; then
    command=(env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "$python" -m torch.distributed.run
      --nnodes "$nodes" --nproc-per-node "$devices" --rdzv-backend c10d --rdzv-endpoint "$addr:$port"
      --max-restarts "${MAX_RESTARTS:-0}" train.py)
  else
    command=("$python" train.py)
  fi
  # setsid: each node is a process group of its own, so that it can be ended with all the processes it started.
  MASTER_ADDR=$addr MASTER_PORT=$port NODE_RANK=$node setsid "${command[@]}" \
    --devices "$devices" --num_nodes "$nodes" --trainer.accelerator cpu "$@" &
  pids+=($!)
done

end_all() { for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done; }
trap 'end_all; exit 130' INT TERM

status=0
for ((left = nodes; left > 0; left--)); do
  wait -n "${pids[@]}"
  code=$?
  if [ "$code" -ne 0 ]; then
    echo "local_cluster: a node exited with status $code; ending the others" >&2
    status=$code
    end_all
    break
  fi
done
wait 2>/dev/null
exit "$status"
