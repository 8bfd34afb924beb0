package faults

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// ConfigMapSource is the simulated Source: faults injected into one ConfigMap (the chart's
// <release>-faults), whose key NodeName holds this node's faults as ParseEntry reads them. Only
// that ConfigMap is watched (RBAC: get, list, watch on it by name). An entry that does not parse
// or names unknown devices or kinds is logged with its key and ignored: the node keeps the faults
// it had. Without the ConfigMap or the key, the node has no faults.
type ConfigMapSource struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
	NodeName  string
	// Known, when set, rejects entries naming devices the node does not publish.
	Known Known
}

var _ Source = &ConfigMapSource{}

// Run watches the ConfigMap until ctx ends.
func (s *ConfigMapSource) Run(ctx context.Context, report func(Faults)) error {
	if s.Client == nil || s.Namespace == "" || s.Name == "" || s.NodeName == "" {
		return errors.New("faults ConfigMap source needs a client, namespace, name and node name")
	}
	logger := klog.FromContext(ctx).WithValues("configMap", klog.KRef(s.Namespace, s.Name), "key", s.NodeName)
	informer := coreinformers.NewFilteredConfigMapInformer(s.Client, s.Namespace, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.FieldSelector = "metadata.name=" + s.Name
	})
	// The informer calls one handler sequentially, so report is never called concurrently.
	handle := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			report(Faults{}) // deleted (possibly as a tombstone): no faults
			return
		}
		faults, err := s.Parse(cm)
		if err != nil {
			logger.Error(err, "Faults entry rejected; keeping the faults the node had")
			return
		}
		report(faults)
	}
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
		DeleteFunc: func(any) { handle(nil) },
	})
	if err != nil {
		return err
	}
	informer.RunWithContext(ctx)
	return nil
}

// Parse returns this node's faults in cm.
func (s *ConfigMapSource) Parse(cm *corev1.ConfigMap) (Faults, error) {
	value, ok := cm.Data[s.NodeName]
	if !ok {
		return Faults{}, nil
	}
	return ParseEntry(s.NodeName, value, s.Known)
}
