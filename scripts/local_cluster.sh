#!/usr/bin/env bash
# A cluster of NODES "nodes" on this machine, for development and tests: each node runs the same train.py command
# with DEVICES processes on CPU (gloo) over loopback, as the nodes of a real cluster would.
#
#   scripts/local_cluster.sh NODES DEVICES -- [fit|validate|test|predict] [train.py arguments]
#   LAUNCHER=torchrun scripts/local_cluster.sh 2 2 -- --trainer.max_epochs 1
#   LAUNCHER=torchrun NNODES=1:2 MAX_RESTARTS=3 scripts/local_cluster.sh 2 1 -- --ckpt_path last   # elastic
#
# LAUNCHER=lightning (default): every node gets MASTER_ADDR, MASTER_PORT and its NODE_RANK, and Lightning's launcher
# starts the node's processes. LAUNCHER=torchrun: every node runs torchrun with c10d rendezvous at MASTER_ADDR:PORT,
# hosted by node 0, restarting the job up to MAX_RESTARTS times (default 0) when a process fails.
# TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: torch's shared rendezvous store keeps the last attempt's addresses, and a
# restarted job fails to connect (torch issue #135712).
#
# NNODES=MIN:MAX makes it an elastic torchrun job (docs/multinode.md, "Elastic"): a node lost leaves the others
# training, and the script waits for every node it started and exits with the first one's status (node 0 holds the
# rendezvous; the job cannot outlive it). FIRST_NODE=K starts nodes K.. of a job already running at MASTER_PORT,
# that join it.
# RDZV_CONF: torchrun's --rdzv-conf; by default a node lost is noticed within 3 s and a rendezvous closes 2 s after
# its minimum is there (torch's defaults: 15 s and 30 s, for real networks).
# NODE_ARGS_K: more train.py arguments for node K alone (split on spaces), as when one node's command line was edited.
# Otherwise the script waits for all nodes; when one fails, it ends every process of every node and exits with that
# node's status.
set -uo pipefail
cd "$(dirname "$0")/.."
nodes=$1 devices=$2
shift 2
[ "${1:-}" = "--" ] && shift
subcommand=()  # first on each node's command line, before the options the script adds
case "${1:-}" in fit | validate | test | predict) subcommand=("$1") && shift ;; esac
python=${PYTHON:-python}
launcher=${LAUNCHER:-lightning}
addr=127.0.0.1
port=${MASTER_PORT:-$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}

nnodes=${NNODES:-$nodes}
first=${FIRST_NODE:-0}
elastic=$([[ "$nnodes" == *:* ]] && echo 1 || echo 0)
rdzv_conf=${RDZV_CONF:-last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3}

pids=()
end_all() { for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done; }
# Ctrl-C or SIGTERM stops every node by SIGTERM, as a cluster stops its nodes: each stops at one step and keeps it.
# (A terminal's Ctrl-C does not reach the nodes, sessions of their own, which ignore SIGINT: started with `&`.) A
# second one ends them at once.
stop_all() {
  trap 'end_all; exit 130' INT TERM
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
  wait 2>/dev/null
  exit "$1"
}
trap 'stop_all 130' INT
trap 'stop_all 143' TERM
for ((node = first; node < first + nodes; node++)); do
  if [ "$launcher" = torchrun ]; then
    host=$([ "$node" = 0 ] && echo true || echo false)
    command=(env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "$python" -m torch.distributed.run
      --nnodes "$nnodes" --nproc-per-node "$devices" --rdzv-backend c10d --rdzv-endpoint "$addr:$port"
      --rdzv-conf "$rdzv_conf,is_host=$host" --max-restarts "${MAX_RESTARTS:-0}" train.py)
  else
    command=("$python" train.py)
  fi
  # The shape: given, as a user of a fixed-size job writes it; an elastic job's comes from torchrun.
  shape=(--devices "$devices" --num_nodes "$nodes")
  [ "$elastic" = 1 ] && shape=()
  # setsid: each node is a process group of its own, so that it can be ended with all the processes it started.
  node_args=NODE_ARGS_$node
  read -ra node_args <<<"${!node_args:-}"
  MASTER_ADDR=$addr MASTER_PORT=$port NODE_RANK=$node setsid "${command[@]}" "${subcommand[@]}" \
    "${shape[@]}" --trainer.accelerator cpu "$@" "${node_args[@]}" &
  pids+=($!)
done

if [ "$elastic" = 1 ]; then  # the others go on without a lost node: wait for all, node 0's status is the job's
  wait "${pids[0]}"
  status=$?
  [ "$status" -ne 0 ] && end_all
  wait 2>/dev/null
  exit "$status"
fi

status=0
for ((left = nodes; left > 0; left--)); do
  wait -n  # any node: one already waited for is no longer a job of this shell ("no such job")
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
