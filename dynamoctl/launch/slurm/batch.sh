#!/usr/bin/env bash
#SBATCH --job-name=dynamoctl
#SBATCH --ntasks-per-node=1
#SBATCH --signal=B:TERM@120
# Run a dynamoctl deployment inside a Slurm allocation:
#
#   sbatch --nodes=N [--gpus-per-node=G] --partition=P slurm/launch.sh RECIPE.yaml
#
# with the recipe's target.nodes, gpus_per_node and partition (an allocation smaller than
# the recipe fails at once, naming the options to add). `dynamoctl up RECIPE` on a login
# node submits this same script with those options, the recipe's time limit, account and
# extra_sbatch_args, and a drain signal sized to supervision.drain_timeout.
#
# This batch script becomes the supervisor (`dynamoctl up`); every instance of the recipe
# runs as an `srun` job step of this job on its node, so Slurm accounts for it and
# `scancel JOBID` ends every step. `dynamoctl up RECIPE` on a login node submits this for
# you with the recipe's target settings. The Python that runs dynamoctl: $DYNAMOCTL_PYTHON,
# else python3 on the PATH sbatch exported (e.g. your activated venv on shared storage).
set -euo pipefail
RECIPE=${1:?usage: sbatch slurm/launch.sh RECIPE.yaml}
PYTHON=${DYNAMOCTL_PYTHON:-python3}
# SIGTERM (scancel --batch --signal=TERM, or --signal=B:TERM@120: two minutes before the
# time limit) reaches the supervisor, which drains and stops every step before the job
# ends. On real GPU nodes add --exclusive (or CPU/memory options): otherwise the job holds
# one CPU per node and every step shares it.
exec "$PYTHON" -m dynamoctl up "$RECIPE" --no-live
