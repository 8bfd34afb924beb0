package faults

import (
	"encoding/json"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// fleet is a fake API server shared by a writer and any number of plugins. Unlike the plain fake
// clientset, each plugin's client applies the field selector of its lists and watches (on
// metadata.name and metadata.namespace, as the API server does for ConfigMaps), so what reaches a
// plugin is what a real server would send it, and counts it.
type fleet struct {
	writer *fake.Clientset
}

func newFleet() *fleet { return &fleet{writer: fake.NewClientset()} }

// received counts the objects (and their bytes, as JSON) sent to one plugin's client.
type received struct {
	mu       sync.Mutex
	objects  int
	bytes    int
	names    []string
	watching int
}

func (r *received) add(cm *corev1.ConfigMap) {
	data, _ := json.Marshal(cm)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.objects++
	r.bytes += len(data)
	r.names = append(r.names, cm.Name)
}

func (r *received) snapshot() (objects, bytes int, names []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.objects, r.bytes, append([]string(nil), r.names...)
}

func (r *received) watches() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.watching
}

// plugin returns a client reading the fleet's objects as a real server would send them.
func (f *fleet) plugin() (*fake.Clientset, *received) {
	tracker := f.writer.Tracker()
	r := &received{}
	cs := &fake.Clientset{}
	cs.AddReactor("*", "*", clienttesting.ObjectReaction(tracker))
	cs.PrependReactor("list", "configmaps", func(action clienttesting.Action) (bool, runtime.Object, error) {
		_, obj, err := clienttesting.ObjectReaction(tracker)(action)
		if err != nil {
			return true, nil, err
		}
		list := obj.(*corev1.ConfigMapList)
		sel := action.(clienttesting.ListAction).GetListRestrictions().Fields
		var kept []corev1.ConfigMap
		for i := range list.Items {
			if matches(sel, &list.Items[i]) {
				kept = append(kept, list.Items[i])
				r.add(&list.Items[i])
			}
		}
		list.Items = kept
		return true, list, nil
	})
	cs.AddWatchReactor("*", func(action clienttesting.Action) (bool, watch.Interface, error) {
		wa := action.(clienttesting.WatchActionImpl)
		w, err := tracker.Watch(action.GetResource(), action.GetNamespace(), wa.ListOptions)
		if err != nil {
			return false, nil, err
		}
		sel := wa.GetWatchRestrictions().Fields
		r.mu.Lock()
		r.watching++
		r.mu.Unlock()
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			cm, ok := e.Object.(*corev1.ConfigMap)
			if !ok || !matches(sel, cm) {
				return e, false
			}
			r.add(cm)
			return e, true
		}), nil
	})
	return cs, r
}

func matches(sel fields.Selector, cm *corev1.ConfigMap) bool {
	return sel == nil || sel.Matches(fields.Set{"metadata.name": cm.Name, "metadata.namespace": cm.Namespace})
}
