#!/bin/bash
# Two machines training one model (Lightning's multi-node DDP), one task per machine, under SLURM:
#
#   sbatch examples/slurm-two-nodes.sh configs/snake_ppo.yaml
#
# srun starts the task on each node and Lightning reads the rendezvous from SLURM's variables; every rank collects
# its own share of the environments. The run folder (runs/ under the folder sbatch ran in) must be on a file system
# every node sees: each rank writes its own state beside the checkpoint. Continue a stopped or preempted job with the
# same script and --ckpt_path last (sbatch examples/slurm-two-nodes.sh configs/snake_ppo.yaml --ckpt_path last).
# With GPUs: --gres=gpu:K, --ntasks-per-node=K, --trainer.devices K and --trainer.accelerator gpu.
# See docs/guide/scaling-out.md.
#SBATCH --job-name=lightrl
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --signal=TERM@120
set -euo pipefail
config="${1:?usage: sbatch examples/slurm-two-nodes.sh configs/<x>.yaml [flags...]}"
shift
srun python -m app fit --config "$config" \
    --trainer.strategy ddp --trainer.num_nodes 2 --trainer.devices 1 --trainer.accelerator cpu "$@"
