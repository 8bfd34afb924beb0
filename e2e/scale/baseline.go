package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gpu-dra/gpu-dra/internal/nodegroups"
)

// baseline is a second webhook that holds one node for the whole run, on a control plane of its
// own (envtest's etcd and kube-apiserver, the same release with its defaults, as the local
// cluster's). The loads sent straight to the webhooks alternate between the fleet's webhook and
// this one round by round, so that "p99 at n nodes against p99 at 1 node, in the same run" is
// asked of rounds seconds apart: on a VM whose host takes a third of its CPU for minutes at a
// time, phases minutes apart are not comparable.
type baseline struct {
	env             *envtest.Environment
	w               *webhook
	templates, pods *reviewer
}

// startBaseline starts the baseline's control plane and webhook; on an error it stops them again.
func startBaseline(ctx context.Context, o Options, ch *chart, groups *nodegroups.Config, driver string) (b *baseline, err error) {
	dir := filepath.Join(o.WorkDir, "baseline")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	b = &baseline{env: &envtest.Environment{BinaryAssetsDirectory: o.BaselineAssets, ControlPlane: envtest.ControlPlane{APIServer: &envtest.APIServer{}}}}
	cfg, err := b.env.Start()
	if err != nil {
		return nil, fmt.Errorf("baseline control plane (--baseline-assets=%s): %w", o.BaselineAssets, err)
	}
	// The returns below set b to nil; stop what was started, not b.
	started := b
	defer func() {
		if err != nil {
			started.stop()
		}
	}()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(cfg, kubeconfig); err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := ch.createClasses(ctx, cs); err != nil {
		return nil, err
	}
	inv := &inventory{cs: cs, groups: groups, driver: driver, workers: 1}
	if err := inv.grow(ctx, 0, 1); err != nil {
		return nil, err
	}
	ob := o
	ob.Kubeconfig = kubeconfig
	if b.w, err = startWebhook(ctx, ch, ob, filepath.Join(dir, "webhook")); err != nil {
		return nil, err
	}
	if err := b.w.waitReady(ctx, 2*time.Minute); err != nil {
		return nil, err
	}
	l := &loader{cs: cs, driver: driver}
	if b.templates, b.pods, err = ch.reviewers(b.w, l); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *baseline) stop() {
	if b.w != nil {
		b.w.stop()
	}
	_ = b.env.Stop()
}

// writeKubeconfig writes cfg (envtest's: client certificate and key) for the webhook process.
func writeKubeconfig(cfg *rest.Config, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["baseline"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["baseline"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["baseline"] = &clientcmdapi.Context{Cluster: "baseline", AuthInfo: "baseline"}
	kc.CurrentContext = "baseline"
	return clientcmd.WriteToFile(*kc, path)
}
