#!/usr/bin/env bash
# Stop one node of the multi-node cluster hard, as a machine losing power: SIGKILL to every process
# of the node (kubelet, containerd, kube-proxy, container shims, the pods' containers) and its
# link down, so that its pods' addresses stop answering. Nothing of it is cleaned up: the node
# stays NotReady until the cluster stops (multinode-down.sh removes what is left).
# usage: multinode-stop-node.sh gpu-node-<i>
set -euo pipefail
source "$(dirname "$0")/multinode-lib.sh"

name=${1:-}
i=${name#gpu-node-}
[ -n "$name" ] && [ -d "$(mn_node_dir "$i")" ] || die "usage: $0 gpu-node-<i> (a node of the running multi-node cluster)"
netns=$(mn_node_netns "$i")
ip -n "$netns" link set eth0 down
pids() {
  mn_pids_in_netns "$netns"
  local h
  for h in /sys/fs/cgroup/*/"$MN_CGROUP/$name"; do
    [ -d "$h" ] && find "$h" -name cgroup.procs -exec cat {} + 2>/dev/null
  done
}
for _ in 1 2 3; do
  p=$(pids | sort -u)
  [ -z "$p" ] && break
  # shellcheck disable=SC2086
  kill -KILL $p 2>/dev/null || true
  sleep 0.2
done
[ -z "$(pids)" ] || die "processes of $name survived SIGKILL: $(pids | tr '\n' ' ')"
step "node $name stopped hard: every process killed, link down"
