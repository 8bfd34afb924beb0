package upgradecheck

import (
	"context"
	"fmt"
	"strings"
	"time"

	apiserverinternal "k8s.io/api/apiserverinternal/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpu-dra/gpu-dra/internal/resourceversion"
	"github.com/gpu-dra/gpu-dra/internal/rewriterecord"
)

// migration is one StorageVersionMigration of any served version, reduced to what the check
// needs.
type migration struct {
	name, group, resource string
	succeeded             bool
}

func checkStorage(ctx context.Context, c Conn, o options, server string, served []string, groups map[string]bool, target Release) Storage {
	st := Storage{Status: Safe, Resources: []StoredResource{}}
	if len(served) == 0 {
		return st
	}
	migrations, source, migErr := listMigrations(ctx, c, o, groups)
	rewrites, stale, recErr := readRewrites(ctx, c, o, server)
	st.Source = source
	encodings := storageEncodings(ctx, c, o, groups)
	if encodings != nil {
		st.Source = strings.TrimPrefix(st.Source+", internal.apiserver.k8s.io/v1alpha1", ", ")
	}
	unmigrated := false
	for _, res := range Resources {
		r := StoredResource{Resource: res, Status: Safe, Encoding: encodings[res]}
		n, err := countObjects(ctx, c, o, served, res)
		r.Objects = n
		if err != nil {
			r.Status = Unknown
			st.Reason = appendReason(st.Reason, fmt.Sprintf("count %s: %v", res, err))
		}
		if l, ok := LifecycleOf(strings.TrimPrefix(r.Encoding, resourceversion.Group+"/")); ok && l.RemovedBy(target) {
			r.Status = NotSafe
			st.Reason = appendReason(st.Reason, fmt.Sprintf("the API server writes %s as %s, which %s cannot read back", res, r.Encoding, target))
		}
		if err == nil && n > 0 && r.Status == Safe {
			r.Migration = succeededFor(migrations, res)
			if r.Migration == "" {
				r.Rewrite = rewrites[res]
			}
			switch {
			case r.Migration != "" || r.Rewrite != "":
			case migErr != nil:
				r.Status = Unknown
			case source != "":
				r.Status = NotSafe
			default:
				r.Status = Unknown
			}
			unmigrated = unmigrated || (r.Migration == "" && r.Rewrite == "")
		}
		st.Status = worst(st.Status, r.Status)
		st.Resources = append(st.Resources, r)
	}
	if !unmigrated {
		return st
	}
	if recErr != nil {
		st.Reason = appendReason(st.Reason, recErr.Error())
	}
	if stale != "" {
		st.Reason = appendReason(st.Reason, stale)
	}
	switch {
	case migErr != nil:
		st.Reason = appendReason(st.Reason, migErr.Error())
	case source == "":
		st.Reason = appendReason(st.Reason, "the cluster does not serve storagemigration.k8s.io, so it cannot tell in which version objects written by older releases are stored")
	default:
		st.Reason = appendReason(st.Reason, "no StorageVersionMigration of "+source+" has succeeded for the resources listed as not migrated")
	}
	st.Fix = MigrateCommand
	return st
}

func appendReason(r, more string) string {
	if r == "" {
		return more
	}
	return r + "; " + more
}

// storageMigrationVersions are the storagemigration.k8s.io versions read, newest first: v1 (1.37),
// v1beta1 (1.35, off unless enabled), v1alpha1 (1.30-1.34, off unless enabled). Their objects
// share the fields read here.
var storageMigrationVersions = []string{"v1", "v1beta1", "v1alpha1"}

// storedMigration is what is read of a StorageVersionMigration of any version.
type storedMigration struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Resource struct {
			Group    string `json:"group"`
			Resource string `json:"resource"`
		} `json:"resource"`
	} `json:"spec"`
	Status struct {
		Conditions []metav1.Condition `json:"conditions"`
	} `json:"status"`
}

// listMigrations lists the StorageVersionMigrations of the newest served version; source is that
// group version, "" when none is served.
func listMigrations(ctx context.Context, c Conn, o options, groups map[string]bool) ([]migration, string, error) {
	for _, v := range storageMigrationVersions {
		gv := schema.GroupVersion{Group: "storagemigration.k8s.io", Version: v}
		if !groups[gv.String()] {
			continue
		}
		var out []migration
		err := pages(ctx, o, func(ctx context.Context, opts metav1.ListOptions) (string, error) {
			l, err := c.Dynamic.Resource(gv.WithResource("storageversionmigrations")).List(ctx, opts)
			if err != nil {
				return "", err
			}
			for _, item := range l.Items {
				var m storedMigration
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.Object, &m); err != nil {
					return "", fmt.Errorf("StorageVersionMigration %s: %w", item.GetName(), err)
				}
				out = append(out, migration{name: m.Metadata.Name, group: m.Spec.Resource.Group, resource: m.Spec.Resource.Resource,
					succeeded: meta.IsStatusConditionTrue(m.Status.Conditions, "Succeeded")})
			}
			return l.GetContinue(), nil
		})
		return out, gv.String(), wrapList(gv.String(), err)
	}
	return nil, "", nil
}

func wrapList(src string, err error) error {
	if err != nil {
		return fmt.Errorf("list StorageVersionMigrations (%s): %w", src, err)
	}
	return nil
}

func succeededFor(ms []migration, resource string) string {
	for _, m := range ms {
		if m.succeeded && m.group == resourceversion.Group && m.resource == resource {
			return m.name
		}
	}
	return ""
}

// storageEncodings are the versions the API server writes each resource in, from the
// StorageVersion API (served with the StorageVersionAPI gate); nil when it is not served.
func storageEncodings(ctx context.Context, c Conn, o options, groups map[string]bool) map[string]string {
	if !groups[apiserverinternal.SchemeGroupVersion.String()] {
		return nil
	}
	out := map[string]string{}
	for _, res := range Resources {
		_ = bounded(ctx, o, func(ctx context.Context) error {
			sv, err := c.Kube.InternalV1alpha1().StorageVersions().Get(ctx, resourceversion.Group+"."+res, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if v := sv.Status.CommonEncodingVersion; v != nil {
				out[res] = *v
			} else if len(sv.Status.StorageVersions) > 0 {
				out[res] = sv.Status.StorageVersions[0].EncodingVersion
			}
			return nil
		})
	}
	return out
}

// countObjects counts one resource's objects by their metadata, a page at a time.
func countObjects(ctx context.Context, c Conn, o options, served []string, resource string) (int, error) {
	n := 0
	err := pages(ctx, o, func(ctx context.Context, opts metav1.ListOptions) (string, error) {
		l, err := c.Metadata.Resource(gvr(served, resource)).List(ctx, opts)
		if err != nil {
			return "", err
		}
		n += len(l.Items)
		return l.Continue, nil
	})
	return n, err
}

// pages calls list with pageSize until the server says there is no more, each call with its own
// timeout.
func pages(ctx context.Context, o options, list func(context.Context, metav1.ListOptions) (string, error)) error {
	cont := ""
	for {
		var next string
		err := bounded(ctx, o, func(ctx context.Context) error {
			var err error
			next, err = list(ctx, metav1.ListOptions{Limit: pageSize, Continue: cont})
			return err
		})
		if err != nil || next == "" {
			return err
		}
		cont = next
	}
}

// readRewrites are the complete rewrites kubectl dra migrate recorded (rewriterecord), by
// resource, described for the report; only those made by the release the cluster runs count, as
// a newer one may store objects in another version: stale says which were set aside. No record
// is no rewrite; a record that cannot be read is an error for the reason, and counts as none.
func readRewrites(ctx context.Context, c Conn, o options, server string) (map[string]string, string, error) {
	var cm *corev1.ConfigMap
	err := bounded(ctx, o, func(ctx context.Context) error {
		var err error
		cm, err = c.Kube.CoreV1().ConfigMaps(rewriterecord.Namespace).Get(ctx, rewriterecord.Name, metav1.GetOptions{})
		return err
	})
	switch {
	case apierrors.IsNotFound(err):
		return nil, "", nil
	case err != nil:
		return nil, "", fmt.Errorf("read the record of kubectl dra migrate's rewrites (ConfigMap %s/%s): %w", rewriterecord.Namespace, rewriterecord.Name, err)
	}
	entries, err := rewriterecord.Decode(cm)
	if err != nil {
		return nil, "", err
	}
	cur, curErr := ParseRelease(server)
	out := map[string]string{}
	var old []string
	for _, res := range Resources {
		e, ok := entries[res]
		if !ok {
			continue
		}
		if rel, err := ParseRelease(e.Server); curErr != nil || err != nil || rel != cur {
			old = append(old, fmt.Sprintf("%s on %s", res, e.Server))
			continue
		}
		out[res] = fmt.Sprintf("rewritten by %s on %s, %s", MigrateCommand, e.Server, e.Completed.UTC().Format(time.RFC3339))
	}
	stale := ""
	if len(old) > 0 {
		stale = fmt.Sprintf("%s rewrote %s, not on the release the cluster runs (%s), which may store objects in another version", MigrateCommand, strings.Join(old, ", "), server)
	}
	return out, stale, nil
}
