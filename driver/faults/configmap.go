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

// ConfigMapSource is the simulated Source: this node's faults, injected by `kubectl dra fault`
// into the node's own ConfigMap ObjectName(Name, NodeName), whose key NodeName holds them as
// ParseEntry reads them. Only that object is listed and watched (field selector metadata.name), so
// the API server sends this plugin the changes of its node and nothing else, whatever the number
// of nodes. An entry that does not parse or names unknown devices or kinds is logged with its key
// and ignored: the node keeps the faults it had. Without the object or the key, the node has no
// faults.
type ConfigMapSource struct {
	Client    kubernetes.Interface
	Namespace string
	// Name is the base name of the per-node objects, the chart's <release>-faults.
	Name     string
	NodeName string
	// Known, when set, rejects entries naming devices the node does not publish.
	Known Known
}

var _ Source = &ConfigMapSource{}

// Run watches the node's ConfigMap until ctx ends.
func (s *ConfigMapSource) Run(ctx context.Context, report func(Faults)) error {
	if s.Client == nil || s.Namespace == "" || s.Name == "" || s.NodeName == "" {
		return errors.New("faults ConfigMap source needs a client, namespace, name and node name")
	}
	name := ObjectName(s.Name, s.NodeName)
	logger := klog.FromContext(ctx).WithValues("configMap", klog.KRef(s.Namespace, name), "key", s.NodeName)
	informer := coreinformers.NewFilteredConfigMapInformer(s.Client, s.Namespace, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.FieldSelector = "metadata.name=" + name
	})
	// The informer calls one handler sequentially, so report is never called concurrently.
	handle := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			report(Faults{}) // deleted (possibly as a tombstone): no faults
			return
		}
		if cm.Name != name {
			// Only a server that ignores the field selector sends another object.
			logger.V(2).Info("Ignoring a ConfigMap that is not this node's", "other", cm.Name)
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
		DeleteFunc: func(obj any) {
			if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Name != name {
				return
			}
			handle(nil)
		},
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
