#!/usr/bin/env bash
# Stop the multi-node local cluster (multinode-up.sh) and leave nothing behind: processes (found by
# PID file, network namespace and cgroup, never by name, so a single-node cluster running beside it
# is untouched), mounts, namespaces, veths, routes and cgroups. Idempotent.
# WIPE=1 also deletes its state ($MN_STATE: logs, binary copies).
set -uo pipefail
source "$(dirname "$0")/multinode-lib.sh"

# kill_all SIGNAL PID...: signal what is still there.
kill_all() { local s=$1; shift; [ $# -eq 0 ] || kill -"$s" "$@" 2>/dev/null; }
# ours: every process of this cluster: in its network namespaces or cgroups.
ours() {
  local ns
  for ns in $(mn_netns); do mn_pids_in_netns "$ns"; done
  mn_cgroup_pids
}

if [ ! -d "$MN_RUN" ] && [ ! -d "/sys/fs/cgroup/memory/$MN_CGROUP" ] && [ -z "$(mn_netns)" ]; then
  step "no multi-node cluster state in $MN_RUN; nothing to stop"
  [ "${WIPE:-0}" = 1 ] && rm -rf "$MN_STATE"
  exit 0
fi
step "stopping the multi-node cluster"
# Pods first, while their kubelets and runtimes still answer: containers end and CNI releases.
for i in $(mn_nodes); do
  stop_pid "$(mn_node_run "$i")/kubelet.pid" TERM 10
  if [ -S "$(mn_node_sock "$i")" ]; then
    CONTAINER_RUNTIME_ENDPOINT=unix://$(mn_node_sock "$i") timeout 60 "$MN_TOOLS/crictl" rmp -fa >/dev/null 2>&1
  fi
  stop_pid "$(mn_node_run "$i")/kube-proxy.pid" TERM 5
  stop_pid "$(mn_node_run "$i")/containerd.pid" TERM 10
done
# The control plane's script stops what it started on SIGINT.
stop_pid "$MN_RUN/control-plane.pid" INT 30
kill_all TERM $(ours)
for _ in $(seq 1 25); do [ -z "$(ours)" ] && break; sleep 0.2; done
kill_all KILL $(ours)
sleep 0.5
left=$(ours)
[ -z "$left" ] || { ps -o pid,args -p "$(echo $left | tr ' ' ',')" >&2; die "processes of the multi-node cluster survived"; }

note "removing mount namespaces, network namespaces and cgroups"
for f in "$MN_RUN"/ns/*.mnt; do
  [ -e "$f" ] || continue
  umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null
  rm -f "$f"
done
mountpoint -q "$MN_RUN/ns" && umount "$MN_RUN/ns"
for ns in $(mn_netns); do ip netns del "$ns" 2>/dev/null; done
ip link del "$MN_HOST_VETH" 2>/dev/null
for h in /sys/fs/cgroup/*/"$MN_CGROUP"; do
  [ -d "$h" ] && find "$h" -depth -type d -exec rmdir {} + 2>/dev/null
done
# The nodes' images, containers and kubelet state (about 150 MiB a node) are made anew by every
# start; their logs and certificates stay until then.
rm -rf "$MN_RUN" "$MN_STATE/nodes"/*/{containerd,containerd-default,kubelet} 2>/dev/null
[ "${WIPE:-0}" = 1 ] && rm -rf "$MN_STATE"

problems=$(
  mn_netns
  ip link show "$MN_HOST_VETH" 2>/dev/null
  ls -d /sys/fs/cgroup/*/"$MN_CGROUP" 2>/dev/null
  grep -F " $MN_RUN" /proc/mounts
)
[ -z "$problems" ] || { echo "$problems" >&2; die "the multi-node cluster left the above behind"; }
step "multi-node cluster stopped"
