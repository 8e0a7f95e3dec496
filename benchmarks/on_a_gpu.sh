#!/usr/bin/env bash
# The GPU figures of benchmarks/README.md ("Round 4") in one go, for a machine lent for minutes: each step
# with a time limit, its whole output in OUT_DIR/STEP.log, the end of it printed.
#   bash benchmarks/on_a_gpu.sh DATA_DIR OUT_DIR
# DATA_DIR holds MNIST/raw/ (the .gz files are unpacked beside them). Run from the repository root; on the lent
# machines of 2026-11-27 these steps took about 6 minutes.
set -u
data=$(realpath "$1") out=$2
mkdir -p "$out"
for packed in "$data"/MNIST/raw/*.gz; do [ -e "${packed%.gz}" ] || gunzip -k "$packed"; done
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

step() {  # NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date +%T)): $*"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    echo "== $name: exit $? at $(date +%T)"
    grep -v -e "it/s" -e "^\s*$" "$out/$name.log" | tail -n "${TAIL:-14}"
}

step machine 60 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; lscpu | grep "Model name";
  nproc; python3 -c "import torch, lightning, torchvision, torchmetrics, jsonargparse, torchdata, sys;
print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.backends.cudnn.version(),
lightning.__version__, torchvision.__version__, torchmetrics.__version__, jsonargparse.__version__)"'

# 1. Time to 99.0% through train.py: the recipe of configs/convnet_fast_gpu.yaml (one device, the network's forward
# and backward replayed as CUDA graphs), five seeds; two of them without the graphs, and one with DDP's wrapper.
clock="--trainer.callbacks+=benchmarks.warm_clock.WarmClock"
recipe="--config $PWD/configs/convnet_fast_gpu.yaml $clock"
step recipe 220 python3 benchmarks/variants.py --data-dir "$data" \
    --variant "seed 1=$recipe --seed_everything 1" --variant "seed 2=$recipe --seed_everything 2" \
    --variant "seed 3=$recipe --seed_everything 3" --variant "seed 4=$recipe --seed_everything 4" \
    --variant "seed 5=$recipe --seed_everything 5" \
    --variant "no graphs, seed 1=$recipe --model.cuda_graph false --seed_everything 1" \
    --variant "no graphs, seed 2=$recipe --model.cuda_graph false --seed_everything 2" \
    --variant "DDP, seed 1=$recipe --trainer.strategy ddp --seed_everything 1"

# 2. The anchor loop, the bare Trainer and train.py's step (with DDP's wrapper, without, with CUDA graphs), interleaved.
step device_step 150 python3 benchmarks/device_step.py --data-dir "$data" --steps 150 --rounds 2

# 3. The stop and the continuation on NCCL (one process), and a frozen process named by the stall watchdog (gloo, the
# CPU cores; rank 1 frozen, then rank 0).
step tests 180 python3 -m pytest -p no:cacheprovider -q tests/test_gpu.py \
    "tests/test_stall_watchdog.py::test_a_frozen_process_is_named_by_the_other_and_the_job_ends"

# 4. The whole command against the tutorial's GPU program.
step whole 90 python3 benchmarks/end_to_end.py --data-dir "$data" --rows convnet --processes 1 --rounds 1 \
    --accelerator gpu
