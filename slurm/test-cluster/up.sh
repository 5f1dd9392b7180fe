#!/bin/bash
# A real SLURM 22.05 cluster with N emulated nodes on this one host, for `pytest -m slurm`.
#
# Measured on these machines (startup in about 14 s) and kept in the repo because
# CI clones the repo. Root, no systemd (Debian 12 containers): every daemon starts by hand.
#   NODES=2 (default)   emulated nodes node1..nodeN: one slurmd each, distinct ports, same host
#   WITH_DBD=1 (default) slurmdbd + MariaDB: submitit needs sacct to see CANCELLED/FAILED jobs
#   SLURM_CI_DIR=/tmp/slurm-ci  state, spool and logs
# Pitfalls handled (each cost a debugging session): DefMemPerCPU or jobs run one at a time;
# AuthInfo=cred_expire=10 and fast scheduler intervals or a requeued job waits minutes;
# KillWait=30 (as on real clusters: the trainer finishes its step and saves before SIGKILL); ReturnToService=1; SlurmdTimeout=10. Only SLURMD_NODENAME tells nodes apart.
# Stop with down.sh. Idempotent: a running cluster is stopped first.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
D=${SLURM_CI_DIR:-/tmp/slurm-ci}; NODES=${NODES:-2}; WITH_DBD=${WITH_DBD:-1}
export DEBIAN_FRONTEND=noninteractive
T0=$(date +%s.%N)
P="slurmctld slurmd slurm-client munge"; [ "$WITH_DBD" = 1 ] && P="$P slurmdbd mariadb-server"
missing=""; for p in $P; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  apt-get install -y --no-install-recommends $missing >/dev/null 2>&1 || { apt-get update -qq; apt-get install -y --no-install-recommends $missing >/dev/null; }
fi
T1=$(date +%s.%N)
[ -s "$D/slurmctld.pid" ] && bash "$HERE/down.sh" >/dev/null 2>&1 || true
H=$(hostname); getent hosts "$H" >/dev/null || echo "127.0.0.1 $H" >> /etc/hosts
mkdir -p $D/state $D/spool $D/log
# --- munge (postinst already creates /etc/munge/munge.key; create if missing)
[ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
install -d -o munge -g munge -m 755 /run/munge          # normally made by systemd-tmpfiles
runuser -u munge -- /usr/sbin/munged                    # daemonizes; pid in /run/munge/munged.pid
munge -n | unmunge >/dev/null
# --- slurm.conf
CPUS=$(nproc); MEM=$(( $(free -m | awk '/^Mem:/{print $2}') / NODES - 512 ))
ACCT=accounting_storage/none; [ "$WITH_DBD" = 1 ] && ACCT=accounting_storage/slurmdbd
cat > /etc/slurm/slurm.conf <<EOF
ClusterName=ci
SlurmctldHost=$H
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
SlurmdTimeout=10
KillWait=30
MinJobAge=3600
ReturnToService=1
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
AccountingStorageType=$ACCT
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
$(for i in $(seq 1 $NODES); do echo "NodeName=node$i NodeHostname=$H NodeAddr=127.0.0.1 Port=$((17000+i)) CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"; done)
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
# --- optional accounting (real sacct; submitit needs sacct to see CANCELLED/FAILED jobs)
if [ "$WITH_DBD" = 1 ]; then
  install -d -o mysql -g mysql /run/mysqld
  (mysqld_safe --user=mysql >$D/log/mysqld_safe.out 2>&1 &)
  for i in $(seq 60); do mysqladmin ping >/dev/null 2>&1 && break; sleep 0.5; done
  mysql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db; CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  cat > /etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
LogFile=$D/log/slurmdbd.log
PidFile=$D/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
EOF
  chmod 600 /etc/slurm/slurmdbd.conf
  slurmdbd
  for i in $(seq 60); do sacctmgr -n show cluster >/dev/null 2>&1 && break; sleep 0.5; done
  sacctmgr -i add cluster ci >/dev/null 2>&1 || true    # already there after a restart
fi
slurmctld
for i in $(seq 1 $NODES); do slurmd -N node$i; done
for i in $(seq 120); do [ "$(sinfo -h -t idle -o %D)" = "$NODES" ] && break; sleep 0.5; done
sinfo
T2=$(date +%s.%N)
awk -v a="$T0" -v b="$T1" -v c="$T2" 'BEGIN{printf "test cluster up: install %.1fs, daemons to idle nodes %.1fs\n", b-a, c-b}'
[ "$(sinfo -h -t idle -o %D)" = "$NODES" ] || { echo "nodes did not become idle; see $D/log" >&2; exit 1; }
