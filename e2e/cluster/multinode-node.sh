# One worker node of the multi-node local cluster: its namespaces, containerd, kubelet and
# kube-proxy. Sourced by multinode-up.sh after multinode-lib.sh, not run.

# mn_node_cgroups I: node I's cgroup root in every hierarchy (the kubelet refuses a cgroup root
# that does not exist). cpuset children start empty in cgroup v1: copy the parent's CPUs and memory
# nodes down.
mn_node_cgroups() {
  local name h d p
  name=$(mn_node_name "$1")
  for h in /sys/fs/cgroup/*; do
    [ -d "$h" ] && [ ! -L "$h" ] && [ "${h##*/}" != unified ] || continue
    for d in "$h/$MN_CGROUP" "$h/$MN_CGROUP/$name"; do
      mkdir -p "$d"
      if [ -f "$d/cpuset.cpus" ] && [ -z "$(cat "$d/cpuset.cpus")" ]; then
        p=$(dirname "$d")
        cat "$p/cpuset.cpus" >"$d/cpuset.cpus"
        cat "$p/cpuset.mems" >"$d/cpuset.mems"
      fi
    done
  done
}

# mn_node_mounts I: node I's mount namespace, kept in a file, with its own directories bound over
# the host paths in MN_NODE_BINDS, so the chart's hostPaths and the kubelet's defaults work as on
# a real machine. Propagation stays inside the namespace: the host never sees these mounts.
mn_node_mounts() {
  local i=$1 dir run b target src script=""
  dir=$(mn_node_dir "$i")
  run=$(mn_node_run "$i")
  mn_ns_dir
  touch "$(mn_node_mntns "$i")"
  for b in $MN_NODE_BINDS; do
    target=${b%%:*}
    src=${b#*:}
    case $src in state/*) src=$dir/${src#state/} ;; run/*) src=$run/${src#run/} ;; esac
    mkdir -p "$target" "$src"
    script="$script mount --bind $src $target &&"
  done
  unshare --mount="$(mn_node_mntns "$i")" --propagation private sh -c "$script mount --make-rshared /"
}

# mn_start I NAME CMD...: run CMD in node I's namespaces in the background, logging and recording
# its PID (nsenter execs CMD: the PID is CMD's).
mn_start() {
  local i=$1 what=$2; shift 2
  nohup nsenter --mount="$(mn_node_mntns "$i")" --net="/run/netns/$(mn_node_netns "$i")" -- "$@" \
    >"$(mn_node_dir "$i")/logs/$what.log" 2>&1 &
  echo $! >"$(mn_node_run "$i")/$what.pid"
}

mn_node_containerd() {
  local i=$1 dir run
  dir=$(mn_node_dir "$i")
  run=$(mn_node_run "$i")
  # The single-node template with this node's paths; pod network namespaces under the node's
  # state (not the host's /run/netns) and no NRI socket in /run/nri shared with the host's.
  sed -e "s#@STATE@#$dir#g" -e "s#@RUN@#$run#g" \
    -e 's#^  enable_cdi = true$#  enable_cdi = true\n  netns_mounts_under_state_dir = true#' \
    "$HERE/containerd.toml.in" >"$dir/containerd.toml"
  printf '\n[plugins."io.containerd.nri.v1.nri"]\n  disable = true\n' >>"$dir/containerd.toml"
  sed -e "s#@STATE@#$dir#g" -e "s#\"gpudra0\"#\"gdra0\"#" -e "s#10.244.0.0/24#$MN_POD_PREFIX.$i.0/24#" \
    "$HERE/cni.conflist.in" >"$dir/cni/net.d/10-gpu-dra.conflist"
  mn_start "$i" containerd env PATH="$PATH" "$MN_TOOLS/containerd" --config "$dir/containerd.toml"
  wait_for 30 "containerd of $(mn_node_name "$i")" "$MN_TOOLS/ctr" -a "$(mn_node_sock "$i")" version mn_check_nodes
  local t ctr=("$MN_TOOLS/ctr" -a "$(mn_node_sock "$i")" -n k8s.io)
  for t in "$CACHE/images/pause.tar" "$CACHE/images/busybox.tar" "$CACHE/images/apiprobe.tar" "$HERE/../../_output/images/gpu-dra.tar"; do
    [ -f "$t" ] || continue
    "${ctr[@]}" images import "$t" 2>&1 >/dev/null | grep -v 'DEPRECATION: The support for cgroup v1' >&2 || true
  done
  note "images: $("${ctr[@]}" images ls -q 2>/dev/null | grep -v '^sha256:' | tr '\n' ' ')"
}

# mn_node_certs I: the kubelet's client certificate (system:node:<name>, which the Node
# authorizer and NodeRestriction check) and serving certificate (for the node's address), both
# signed by the cluster's client CA, which the API server trusts for both.
mn_node_certs() {
  local i=$1 name ip d c=$MN_CERTS kind subj ext
  name=$(mn_node_name "$i")
  ip=$(mn_node_ip "$i")
  d=$(mn_node_dir "$i")/pki
  mkdir -p "$d"
  for kind in client serving; do
    subj="/O=system:nodes/CN=system:node:$name"
    if [ $kind = client ]; then ext="extendedKeyUsage=clientAuth"; else ext="extendedKeyUsage=serverAuth
subjectAltName=DNS:$name,IP:$ip"; fi
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n%s\n' "$ext" >"$d/$kind.ext"
    { openssl req -new -newkey rsa:2048 -nodes -subj "$subj" -keyout "$d/$kind.key" -out "$d/$kind.csr" &&
      openssl x509 -req -in "$d/$kind.csr" -CA "$c/client-ca.crt" -CAkey "$c/client-ca.key" \
        -set_serial "0x$(openssl rand -hex 16)" -days 365 -extfile "$d/$kind.ext" -out "$d/$kind.crt"
    } >"$d/$kind.log" 2>&1 || { cat "$d/$kind.log" >&2; die "cannot make the $kind certificate of $name"; }
  done
  kubectl config set-cluster local --server="https://$MN_CP_IP:6443" --certificate-authority="$c/server-ca.crt" \
    --embed-certs --kubeconfig="$d/kubelet.kubeconfig" >/dev/null
  kubectl config set-credentials node --client-certificate="$d/client.crt" --client-key="$d/client.key" \
    --embed-certs --kubeconfig="$d/kubelet.kubeconfig" >/dev/null
  kubectl config set-context local --cluster=local --user=node --kubeconfig="$d/kubelet.kubeconfig" >/dev/null
  kubectl config use-context local --kubeconfig="$d/kubelet.kubeconfig" >/dev/null
}

# mn_feature_gates: FEATURE_GATES (A=true,B=false) as a featureGates map of a component config.
mn_feature_gates() {
  local g
  [ -n "${FEATURE_GATES:-}" ] || return 0
  echo "featureGates:"
  for g in ${FEATURE_GATES//,/ }; do echo "  ${g%%=*}: ${g#*=}"; done
}

mn_node_kubelet() {
  local i=$1 name ip dir
  name=$(mn_node_name "$i")
  ip=$(mn_node_ip "$i")
  dir=$(mn_node_dir "$i")
  mn_node_certs "$i"
  # failCgroupV1: kubelets from 1.35 refuse cgroup v1 hosts otherwise (this kind of VM is v1).
  # Images come from tarballs, not a registry: garbage collection must never remove them.
  cat >"$dir/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
healthzBindAddress: 127.0.0.1
port: 10250
readOnlyPort: 0
cgroupDriver: cgroupfs
cgroupRoot: /$MN_CGROUP/$name
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$(mn_node_sock "$i")
staticPodPath: $dir/static-pods
tlsCertFile: $dir/pki/serving.crt
tlsPrivateKeyFile: $dir/pki/serving.key
rotateCertificates: false
serverTLSBootstrap: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $MN_CERTS/client-ca.crt}
authorization: {mode: Webhook}
$(mn_feature_gates)
YAML
  mkdir -p "$dir/static-pods"
  mn_start "$i" kubelet "$MN_BIN/kubelet" --config="$dir/kubelet.yaml" --kubeconfig="$dir/pki/kubelet.kubeconfig" \
    --hostname-override="$name" --node-ip="$ip" --v=2
}

mn_node_kube_proxy() {
  local i=$1 dir
  dir=$(mn_node_dir "$i")
  cat >"$dir/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $MN_CERTS/kube-proxy.kubeconfig}
hostnameOverride: $(mn_node_name "$i")
bindAddress: $(mn_node_ip "$i")
clusterCIDR: $MN_CLUSTER_CIDR
mode: iptables
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# The namespace's conntrack limits are the host's: leave them alone.
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
$(mn_feature_gates)
YAML
  mn_start "$i" kube-proxy "$MN_BIN/kube-proxy" --config="$dir/kube-proxy.yaml" --v=2
}

# mn_node_up I: node I from nothing (the network is up, the control plane answers).
mn_node_up() {
  local i=$1 dir run
  dir=$(mn_node_dir "$i")
  run=$(mn_node_run "$i")
  mkdir -p "$dir"/{logs,cni/net.d,cni/ipam} "$run"
  mn_node_cgroups "$i"
  mn_node_mounts "$i"
  mn_node_containerd "$i"
  mn_node_kubelet "$i"
  mn_node_kube_proxy "$i"
}
