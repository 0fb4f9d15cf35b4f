#!/usr/bin/env bash
# fake_slurm.sh COLL_CHECK — the srun path without a Slurm cluster: three
# processes get exactly the variables srun sets for a one-node step of 3
# tasks (no DT_* at all) and must find each other: rank and size from
# SLURM_PROCID/SLURM_STEP_NUM_TASKS, master = first host of
# SLURM_STEP_NODELIST, port and token derived from the job and step id.
set -uo pipefail
coll=$1
pids=()
job=$((RANDOM + 1000)) # one job id for all three, like srun
for r in 0 1 2; do
    env -u DT_RANK -u DT_WORLD_SIZE -u DT_MASTER_ADDR -u DT_MASTER_PORT -u DT_JOB_TOKEN \
        SLURM_JOB_ID=$job SLURM_STEP_ID=0 SLURM_PROCID=$r SLURM_NTASKS=3 \
        SLURM_STEP_NUM_TASKS=3 SLURM_LOCALID=$r SLURM_NODEID=0 SLURM_STEP_TASKS_PER_NODE=3 \
        SLURM_STEP_NODELIST=localhost DT_TIMEOUT=30 "$coll" --expect-transport shm &
    pids+=($!)
done 2>&1
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
