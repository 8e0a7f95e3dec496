#!/usr/bin/env bash
# The GPU figures of benchmarks/README.md in one go, for a machine lent for minutes: each step with a time limit, its
# whole output in OUT_DIR/STEP.log, the end of it printed. Run from the repository root:
#   bash benchmarks/on_a_gpu.sh DATA_DIR OUT_DIR
# DATA_DIR holds MNIST/raw/ (.gz files are unpacked beside them). Not yet run on a GPU as it stands (2026-12-01).
set -u
data=$(realpath "$1") out=$2
mkdir -p "$out"
for packed in "$data"/MNIST/raw/*.gz; do [ -e "$packed" ] && { [ -e "${packed%.gz}" ] || gunzip -k "$packed"; }; done
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

step() {  # NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date +%T)): $*"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    echo "== $name: exit $? at $(date +%T)"
    grep -v -e "it/s" -e "^\s*$" "$out/$name.log" | tail -n "${TAIL:-12}"
}

step machine 30 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc;
  python3 -c "import torch, lightning, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda,
torch.backends.cudnn.version(), lightning.__version__)"'

# 1. The step: train.py's against the plain loop's, one process (nccl's process group: none with one process), in the
# same process; ConvNet's defaults at batch 512, then the net and recipe of configs/convnet_fast_gpu.yaml (data on
# the GPU for train.py, in host memory for the plain loop; CUDA graphs for train.py).
step step_convnet 90 python3 benchmarks/step.py --data-dir "$data" --accelerator gpu --processes 1 \
    --model ConvNet --batch-size 512 --chunks 6
fast="--config $PWD/configs/convnet_fast_gpu.yaml --trainer.max_epochs -1"
step step_fast 90 python3 benchmarks/step.py --data-dir "$data" --accelerator gpu --processes 1 --model ConvNet \
    --chunks 6 --options "$fast"
step step_fast_eager 90 python3 benchmarks/step.py --data-dir "$data" --accelerator gpu --processes 1 --model ConvNet \
    --chunks 6 --options "$fast --model.cuda_graph false --data.on_device false"

# 2. Warm training to 99% test accuracy through train.py (configs/convnet_fast_gpu.yaml), three seeds, one round each.
recipe="python train.py --config configs/convnet_fast_gpu.yaml --data.data_dir $data"
recipe="$recipe --trainer.callbacks+=benchmarks.commands.WarmClock"
step recipe 150 python3 benchmarks/commands.py --rounds 1 \
    "seed 1=$recipe --seed_everything 1" "seed 2=$recipe --seed_everything 2" "seed 3=$recipe --seed_everything 3"

# 3. Whole commands on the GPU: train.py against plain_ddp.py, ConvNet's defaults, one epoch, one process.
step whole 120 python3 benchmarks/commands.py --rounds 2 \
    "train.py=python train.py --model ConvNet --data.dataset mnist --data.data_dir $data --trainer.max_epochs 1" \
    "plain=python benchmarks/plain_ddp.py --model ConvNet --dataset mnist --data-dir $data --epochs 1"

# 4. The GPU's tests: a stop continues to the same weights, a bug is one traceback, the graphs train as the usual step.
step tests 150 python3 -m pytest -p no:cacheprovider -q -n 0 tests/test_gpu.py
