#!/bin/bash
# Stop the test cluster started by up.sh: slurmd's, slurmctld, slurmdbd, munge, MariaDB.
# Jobs still running are cancelled first so no job step outlives the daemons.
D=${SLURM_CI_DIR:-/tmp/slurm-ci}
[ -s "$D/slurmctld.pid" ] && command -v scancel >/dev/null && timeout 15 scancel --full --quiet -u "$(id -un)" 2>/dev/null
for f in $D/slurmd-*.pid $D/slurmctld.pid $D/slurmdbd.pid /run/munge/munged.pid; do
  [ -s "$f" ] || continue
  pid=$(cat "$f"); kill "$pid" 2>/dev/null || continue
  for i in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  rm -f "$f"
done
mysqladmin shutdown 2>/dev/null; true
