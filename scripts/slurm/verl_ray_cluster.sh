#!/usr/bin/env bash
# A Ray cluster over the nodes of one SLURM allocation, then a sweep with engine=verl on it.
#
#   sbatch --nodes=2 --gpus-per-node=8 scripts/slurm/verl_ray_cluster.sh experiment=quatro_paper_verl
#
# Node 0 runs the Ray head, every other node one Ray worker (one srun step per node, --overlap so the
# steps share the allocation); when all nodes have joined, `python sweep.py -m <args>` runs on node 0
# with RAY_ADDRESS set, so each sweep point's verl trainer uses every GPU of every node. Points run one
# after another (one cluster per allocation). Arguments are passed to sweep.py unchanged.
#
# Security: the Ray head's port is guarded only by the auth token in ~/.ray (whoever can read it can run code
# on the cluster): run this only on a private cluster network. Environment: RAY_PORT (6379), RLVR_PYTHON (python), RAY_CMD (ray, from the same environment as python),
# RLVR_RAY_WAIT_S (600), GPUS_PER_NODE and CPUS_PER_NODE (from SLURM). Ray's auth token (~/.ray) must be
# on a home directory the nodes share.
#SBATCH --job-name=rlvr-verl
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
set -euo pipefail

: "${SLURM_JOB_NODELIST:?run this inside a SLURM allocation (sbatch or salloc)}"
PY=${RLVR_PYTHON:-python}
RAY_CMD=${RAY_CMD:-ray}
RAY_PORT=${RAY_PORT:-6379}
WAIT_S=${RLVR_RAY_WAIT_S:-600}

# One hostname per array element. verl's example script wrote nodes=$(scontrol show hostnames ...) and
# then used "${nodes[@]}", which is a single element holding every hostname (verl issue 548).
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
NNODES=${#NODES[@]}
if (( NNODES < 1 )); then
  echo "verl_ray_cluster: no hosts in SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST" >&2; exit 2
fi
HEAD=${NODES[0]}
GPUS=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-1}}}
GPUS=${GPUS##*:}   # "h100:8" -> 8
CPUS=${CPUS_PER_NODE:-${SLURM_CPUS_ON_NODE:-1}}

# the head's routable address (hostname -I lists the interface addresses; --ip-address can say 127.0.1.1)
HEAD_IP=$(srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" hostname -I | awk '{print $1}')
ADDRESS="$HEAD_IP:$RAY_PORT"
echo "verl_ray_cluster: $NNODES node(s) [${NODES[*]}], head $HEAD ($ADDRESS), $GPUS GPU(s) per node"

PIDS=()
cleanup() { for p in ${PIDS[@]+"${PIDS[@]}"}; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

srun --overlap --nodes=1 --ntasks=1 -c "$CPUS" -w "$HEAD" \
  "$RAY_CMD" start --head --node-ip-address="$HEAD_IP" --port="$RAY_PORT" --num-gpus="$GPUS" --num-cpus="$CPUS" --block &
PIDS+=($!)
for ((i = 1; i < NNODES; i++)); do
  srun --overlap --nodes=1 --ntasks=1 -c "$CPUS" -w "${NODES[$i]}" \
    "$RAY_CMD" start --address="$ADDRESS" --num-gpus="$GPUS" --num-cpus="$CPUS" --block &
  PIDS+=($!)
done

# wait until every node has joined
"$PY" - "$ADDRESS" "$NNODES" "$WAIT_S" <<'PYEOF'
import sys, time
address, want, wait_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
import ray
deadline = time.time() + wait_s
while True:
    try:
        ray.init(address=address, log_to_driver=False)
        break
    except Exception as e:  # the head is still starting
        if time.time() > deadline:
            sys.exit(f"verl_ray_cluster: no Ray head at {address} after {wait_s:.0f} s: {e}")
        time.sleep(3)
while (alive := sum(1 for n in ray.nodes() if n["Alive"])) < want:
    if time.time() > deadline:
        sys.exit(f"verl_ray_cluster: only {alive}/{want} nodes joined after {wait_s:.0f} s")
    time.sleep(3)
print(f"verl_ray_cluster: {alive} nodes joined")
PYEOF

export RAY_ADDRESS="$ADDRESS"
"$PY" sweep.py -m engine=verl engine.nnodes="$NNODES" engine.n_gpus_per_node="$GPUS" "$@"
