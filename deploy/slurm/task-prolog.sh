#!/bin/sh
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/llmmon-task-prolog.sh). Lines printed as
# "export NAME=value" enter the environment of every task, so each rank's llmmon reporter
# labels its series with the Slurm job id without any change to job scripts.
[ -n "${SLURM_JOB_ID:-}" ] || exit 0
echo "export LLMMON_JOB=${SLURM_JOB_ID}"
echo "export LLMMON_SPOOL=/run/llmmon/ranks"
