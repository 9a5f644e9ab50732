#!/usr/bin/env bash
#SBATCH --ntasks-per-node=1
# An extra job of a dynamoctl deployment that grew beyond its allocation (recipe
# target.growth; docs/operations.md, "Growing beyond the allocation"). The supervisor
# submits it, runs replicas on its nodes as job steps of it, and cancels it once they are
# drained. It holds its nodes until then, and ends by itself as soon as the deployment's
# own job is no longer running, so a supervisor that died cannot leave it holding nodes.
set -uo pipefail
PARENT=${1:?usage: growth.sh PARENT_JOB_ID}
while [ "$(squeue --jobs="$PARENT" -h -o %T 2>/dev/null)" = RUNNING ]; do
    sleep 5
done
echo "deployment job $PARENT is no longer running: releasing this job's nodes"
