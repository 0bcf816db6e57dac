#!/usr/bin/env bash
# Several nodes: run this same command on every node. torchrun's c10d
# rendezvous (hosted by the process on HEAD_ADDR) assigns the ranks; rank 0
# (on whichever node gets it) reads the prompts and writes the results, so
# output.dir must be on that node (or a shared filesystem). With several LP
# groups (distributed.lp_size below the world size) every group's leader
# reads the prompts and writes into output.dir: then it must be one shared
# directory (docs/distributed.md, "Multi-node").
# MAX_RESTARTS=N restarts every node's workers up to N times after a worker
# fails; the restarted job resumes from the records written.
#   NNODES=2 NPROC=8 HEAD_ADDR=node0 JOB_ID=lp-42 launch/multi_node.sh --config configs/X.yaml
set -euo pipefail
: "${NNODES:?number of nodes}" "${HEAD_ADDR:?host name or address of the rendezvous node}"
NPROC=${NPROC:-8}
PORT=${PORT:-29500}
JOB_ID=${JOB_ID:-lp}
# a store server of each restart's own: torchrun shares one across restarts by default, and a restarted
# worker could read the killed workers' addresses there (docs/distributed.md, "Failures")
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}
exec torchrun --nnodes="$NNODES" --nproc-per-node="$NPROC" --max-restarts="${MAX_RESTARTS:-0}" \
    --rdzv-backend=c10d --rdzv-endpoint="$HEAD_ADDR:$PORT" --rdzv-id="$JOB_ID" \
    -m lp.run "$@"
