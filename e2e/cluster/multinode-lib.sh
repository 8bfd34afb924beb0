# Settings and helpers of the multi-node local cluster (MODE=multinode). Sourced, not run.
#
# Each node is a network namespace and a mount namespace of this machine: its own kubelet,
# containerd, kube-proxy, addresses, iptables rules, kubelet root (/var/lib/kubelet), CDI
# directories (/etc/cdi, /var/run/cdi), pod logs and cgroup root. The control plane has a network
# namespace of its own, so it and every node may use the standard ports while a single-node cluster
# (up.sh) runs on the host at the same time. Nothing here touches the host's routes or iptables
# rules but one veth (gdra-mn0) and the routes through it to this cluster's own subnets.
#
# Layout: state under $MN_STATE, sockets and namespace files under $MN_RUN, every binary run from
# copies in $MN_STATE/bin (the single-node down.sh kills processes by the path of the cached
# binaries; these never match), cgroups under /$MN_CGROUP.

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NODES=${NODES:-3}
MN_STATE=${GPU_DRA_MN_STATE:-/var/lib/gpu-dra-multinode}
MN_RUN=${GPU_DRA_MN_RUN:-/run/gpu-dra-multinode}
MN_CGROUP=gpu-dra-multinode
MN_BIN=$MN_STATE/bin/k8s
MN_TOOLS=$MN_STATE/bin/tools
MN_CERTS=$MN_STATE/control-plane/certs
MN_KUBECONFIG=$MN_CERTS/admin.kubeconfig
# Addresses: none of them is used by the host or by the single-node cluster (pods 10.244.0.0/24,
# cluster CIDR 10.1.0.0/16, services 10.0.0.0/24).
MN_LINK_PREFIX=10.245.0      # the nodes' link: host .1, control plane .2, node i .(10+i)
MN_POD_PREFIX=10.246         # node i's pods: 10.246.i.0/24
MN_CLUSTER_CIDR=10.246.0.0/16
MN_SERVICE_CIDR=10.247.0.0/24
MN_FIRST_SERVICE_IP=10.247.0.1
MN_CP_IP=$MN_LINK_PREFIX.2
MN_HOST_IP=$MN_LINK_PREFIX.1
MN_HOST_VETH=gdra-mn0
MN_NS_SWITCH=gdra-mn-switch
MN_NS_CP=gdra-mn-cp

mn_node_name() { echo "gpu-node-$1"; }
mn_node_ip() { echo "$MN_LINK_PREFIX.$((10 + $1))"; }
mn_node_netns() { echo "gdra-mn-node-$1"; }
mn_node_dir() { echo "$MN_STATE/nodes/$(mn_node_name "$1")"; }
mn_node_run() { echo "$MN_RUN/nodes/$(mn_node_name "$1")"; }
mn_node_mntns() { echo "$MN_RUN/ns/$(mn_node_name "$1").mnt"; }
mn_node_sock() { echo "$(mn_node_run "$1")/containerd/containerd.sock"; }
# mn_node_exec I CMD...: CMD in node I's network and mount namespaces.
mn_node_exec() {
  local i=$1; shift
  nsenter --mount="$(mn_node_mntns "$i")" --net="/run/netns/$(mn_node_netns "$i")" -- "$@"
}
# The nodes that exist now, from their state directories (down.sh stops whatever NODES was).
mn_nodes() {
  local d
  for d in "$MN_STATE"/nodes/gpu-node-*; do [ -d "$d" ] && echo "${d##*-}"; done | sort -n
}

# Paths a node sees as its own, bound over the host's in its mount namespace: target and the
# per-node source under the node's state (persistent) or run (sockets, CDI specs) directory. Pod
# logs too: a kubelet removes the log directories of pods its runtime does not know, which on a
# shared /var/log/pods would be every other node's (and the single-node cluster's).
MN_NODE_BINDS="/var/lib/kubelet:state/kubelet /etc/cdi:state/etc-cdi /run/cdi:run/cdi
/run/containerd:run/containerd-default /var/lib/containerd:state/containerd-default
/var/log/pods:state/log-pods /var/log/containers:state/log-containers /run/nri:run/nri"

# mn_copy_bin SRC DIR: a copy of SRC in DIR (a hard link where the file system allows it).
mn_copy_bin() {
  local src=$1 dir=$2 dst
  dst=$dir/$(basename "$src")
  [ -x "$src" ] || die "$src is missing"
  mkdir -p "$dir"
  if [ -e "$dst" ] && [ "$dst" -ef "$src" ]; then return 0; fi
  rm -f "$dst"
  ln "$src" "$dst" 2>/dev/null || cp "$src" "$dst"
}

# mn_netns: this cluster's network namespaces. `ip netns list` complains on stderr, once per
# call and entry, about namespaces of other runtimes whose peer is gone: not ours, not news.
mn_netns() { ip netns list 2>/dev/null | awk '/^gdra-mn-/{print $1}'; }

# mn_pids_in_netns NAME: processes whose network namespace is NAME.
mn_pids_in_netns() { [ -e "/run/netns/$1" ] && ip netns pids "$1" 2>/dev/null || true; }

# mn_cgroup_pids: processes in this cluster's cgroups (pods' containers), any hierarchy.
mn_cgroup_pids() {
  local d
  for d in /sys/fs/cgroup/*/"$MN_CGROUP"; do
    [ -d "$d" ] && find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -u
}

mn_running() {
  [ -f "$MN_RUN/control-plane.pid" ] && kill -0 "$(cat "$MN_RUN/control-plane.pid")" 2>/dev/null
}

# --- network -----------------------------------------------------------------------------------

# mn_sysctl NETNS KEY VALUE: a sysctl of one network namespace (net.* are per namespace).
mn_sysctl() {
  local f=/proc/sys/${2//.//}
  nsenter --net="/run/netns/$1" -- sh -c "[ ! -e $f ] || echo $3 > $f"
}

# mn_attach NETNS PORT IP: a veth from the bridge (port PORT) to eth0 of NETNS with address IP.
mn_attach() {
  local ns=$1 port=$2 ip=$3
  ip netns add "$ns"
  ip -n "$MN_NS_SWITCH" link add "$port" type veth peer name eth0 netns "$ns"
  ip -n "$MN_NS_SWITCH" link set "$port" master gdra-br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$ip/24" dev eth0
  ip -n "$ns" link set eth0 up
  mn_sysctl "$ns" net.ipv4.ip_forward 1
  # No default route: connections to a Service's address need a route before kube-proxy's DNAT.
  ip -n "$ns" route add "$MN_SERVICE_CIDR" dev eth0
}

# mn_network_up: the bridge lives in a namespace of its own, so the host gets one veth and the
# routes to this cluster's subnets, nothing else. Every namespace routes each node's pod subnet to
# that node and the Service range to its link; no default route: nothing here needs to leave the
# machine (no registry).
mn_network_up() {
  local i j ns
  ip netns add "$MN_NS_SWITCH"
  ip -n "$MN_NS_SWITCH" link set lo up
  ip -n "$MN_NS_SWITCH" link add gdra-br0 type bridge
  ip -n "$MN_NS_SWITCH" link set gdra-br0 up
  # Bridged frames between nodes skip the switch namespace's (empty) iptables.
  mn_sysctl "$MN_NS_SWITCH" net.bridge.bridge-nf-call-iptables 0
  ip link add "$MN_HOST_VETH" type veth peer name host netns "$MN_NS_SWITCH"
  ip -n "$MN_NS_SWITCH" link set host master gdra-br0 up
  ip addr add "$MN_HOST_IP/24" dev "$MN_HOST_VETH"
  ip link set "$MN_HOST_VETH" up
  mn_attach "$MN_NS_CP" cp "$MN_CP_IP"
  for i in $(seq 1 "$NODES"); do
    mn_attach "$(mn_node_netns "$i")" "n$i" "$(mn_node_ip "$i")"
    # kube-proxy's rules must see pod-to-service traffic that stays on the node's bridge.
    mn_sysctl "$(mn_node_netns "$i")" net.bridge.bridge-nf-call-iptables 1
  done
  for j in $(seq 1 "$NODES"); do
    ip route add "$MN_POD_PREFIX.$j.0/24" via "$(mn_node_ip "$j")" dev "$MN_HOST_VETH"
    ip -n "$MN_NS_CP" route add "$MN_POD_PREFIX.$j.0/24" via "$(mn_node_ip "$j")"
    for i in $(seq 1 "$NODES"); do
      [ "$i" = "$j" ] || ip -n "$(mn_node_netns "$i")" route add "$MN_POD_PREFIX.$j.0/24" via "$(mn_node_ip "$j")"
    done
  done
}

# --- control plane -----------------------------------------------------------------------------

# mn_ns_dir: the directory of the mount namespace files (a namespace file may only be bound on a
# private mount).
mn_ns_dir() {
  mkdir -p "$MN_RUN/ns"
  if ! mountpoint -q "$MN_RUN/ns"; then
    mount --bind "$MN_RUN/ns" "$MN_RUN/ns"
    mount --make-private "$MN_RUN/ns"
  fi
}

# mn_control_plane_up: hack/local-up-cluster.sh in the control plane's network namespace and in a
# mount namespace whose /etc/hosts names the nodes: the API server reaches a kubelet (exec, logs)
# by the node's hostname first, and there is no DNS.
mn_control_plane_up() {
  local d=$MN_STATE/control-plane script i
  script=$(local_up_script "$K8S_VERSION")
  { cat /etc/hosts; for i in $(seq 1 "$NODES"); do echo "$(mn_node_ip "$i") $(mn_node_name "$i")"; done; } >"$d/hosts"
  mn_ns_dir
  touch "$MN_RUN/ns/control-plane.mnt"
  unshare --mount="$MN_RUN/ns/control-plane.mnt" --propagation private mount --bind "$d/hosts" /etc/hosts
  # --default-signal: a background job otherwise ignores the SIGINT that makes the script clean up.
  nsenter --net="/run/netns/$MN_NS_CP" --mount="$MN_RUN/ns/control-plane.mnt" -- env --default-signal=INT PATH="$PATH" USER=root \
    HOSTNAME_OVERRIDE=gpu-dra-control-plane ENABLE_DAEMON=false START_MODE=nokubelet GO_OUT="$MN_BIN" \
    API_HOST="$MN_CP_IP" API_HOST_IP="$MN_CP_IP" SERVICE_CLUSTER_IP_RANGE="$MN_SERVICE_CIDR" \
    FIRST_SERVICE_CLUSTER_IP="$MN_FIRST_SERVICE_IP" CLUSTER_CIDR="$MN_CLUSTER_CIDR" \
    KUBE_ENABLE_CLUSTER_DNS=false KUBE_DEFAULT_STORAGE_CLASS=false ALLOW_PRIVILEGED=true \
    RUNTIME_CONFIG="${RUNTIME_CONFIG:-}" FEATURE_GATES="${FEATURE_GATES:-AllAlpha=false}" \
    LOG_DIR="$d/logs" CERT_DIR="$d/certs" TMP_DIR="$d/tmp" POD_MANIFEST_PATH="$d/static-pods" \
    bash "$script" -o "$MN_BIN" >"$d/logs/local-up-cluster.log" 2>&1 &
  echo $! >"$MN_RUN/control-plane.pid"
}

mn_check_control_plane() {
  mn_running && return 0
  tail -30 "$MN_STATE/control-plane/logs/local-up-cluster.log" >&2
  die "the control plane's hack/local-up-cluster.sh exited (log: $MN_STATE/control-plane/logs/local-up-cluster.log)"
}

mn_check_nodes() {
  local i p
  [ ! -f "$MN_RUN/control-plane.pid" ] || mn_check_control_plane
  for i in $(mn_nodes); do
    for p in containerd kubelet kube-proxy; do
      [ -f "$(mn_node_run "$i")/$p.pid" ] || continue
      kill -0 "$(cat "$(mn_node_run "$i")/$p.pid")" 2>/dev/null && continue
      tail -20 "$(mn_node_dir "$i")/logs/$p.log" >&2
      die "$p of $(mn_node_name "$i") exited (log: $(mn_node_dir "$i")/logs/$p.log)"
    done
  done
}
