# Sourced by .ci/run: a SLURM cluster of one node (this machine), so that
# chorus runs under srun as it does on a real cluster. Debian's slurm-wlm,
# a configuration of its own under $SLURM_DIR (exported as SLURM_CONF), and
# munge for authentication. `slurm_stop` ends the daemons.

slurm_start() {
  if ! command -v slurmctld >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm >/dev/null
  fi
  SLURM_DIR="$(mktemp -d)"
  mkdir -p "$SLURM_DIR/ctld" "$SLURM_DIR/d"
  local host; host="$(hostname -s)"
  cat > "$SLURM_DIR/slurm.conf" <<CONF
ClusterName=chorus-ci
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6917
SlurmdPort=6918
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=$SLURM_DIR/ctld
SlurmdSpoolDir=$SLURM_DIR/d
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
# More task slots than cores: chorus's test ranks are light.
SlurmdParameters=config_overrides
NodeName=$host CPUs=8 State=UNKNOWN
PartitionName=ci Nodes=$host Default=YES MaxTime=30 State=UP
CONF
  export SLURM_CONF="$SLURM_DIR/slurm.conf"
  if ! pgrep -x munged >/dev/null; then
    mkdir -p /run/munge && chown munge:munge /run/munge
    su -s /bin/sh munge -c /usr/sbin/munged
  fi
  slurmd -c -L "$SLURM_DIR/slurmd.log"
  slurmctld -c -L "$SLURM_DIR/slurmctld.log"
  local i
  for i in $(seq 50); do
    sinfo -h -o %t 2>/dev/null | grep -q idle && return 0
    sleep 0.2
  done
  echo "the SLURM node did not come up:" >&2
  cat "$SLURM_DIR"/*.log >&2
  return 1
}

slurm_stop() {
  [ -n "${SLURM_DIR:-}" ] || return 0
  # Stops slurmctld and every slurmd (and slurmctld's script helper).
  scontrol shutdown >/dev/null 2>&1 || true
  local i
  for i in $(seq 50); do
    pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || break
    sleep 0.2
  done
  rm -rf "$SLURM_DIR"
}
