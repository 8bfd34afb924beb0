package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	cgoresource "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra/driver/checkpoint"
	"github.com/gpu-dra/gpu-dra/driver/metrics"
)

// ClaimGetter reads ResourceClaims in whatever version the server serves
// (k8s.io/dynamic-resource-allocation/client implements it).
type ClaimGetter interface {
	ResourceClaims(namespace string) cgoresource.ResourceClaimInterface
}

// LockFileName is the helper's serialization lock in the plugin data directory (see
// kubeletplugin.Start with RollingUpdate); reconciliation takes the same lock so it never runs while
// another instance is inside a prepare or unprepare.
const LockFileName = "serialize.lock"

// ReconcileResult says what Reconcile changed.
type ReconcileResult struct {
	// Corrupt is set when the checkpoint was corrupt and got moved aside.
	Corrupt *checkpoint.CorruptError
	// Recovered are claims rebuilt from their CDI specs after the checkpoint was lost.
	Recovered []types.UID
	// RestoredSpecs are entries whose missing CDI spec was rewritten.
	RestoredSpecs []types.UID
	// RemovedOrphans are CDI specs without a checkpoint entry (a prepare that crashed).
	RemovedOrphans []types.UID
	// Unprepared are entries whose claim is gone from the API server or was replaced.
	Unprepared []types.UID
	// Rebooted are entries from before the node's last reboot; nothing of them is prepared any
	// more, and the kubelet prepares again what its pods still need.
	Rebooted []types.UID
	// Prepared is the number of entries afterwards.
	Prepared int
}

// Reconcile makes the CDI directory and the checkpoint agree again after a crash or restart, then
// drops claims that no longer exist. Rules:
//   - a corrupt checkpoint is moved aside, reported and rebuilt from the CDI specs (loadState);
//   - entries from an earlier boot are dropped (their specs become orphans and are removed);
//   - an entry without its spec gets the spec rewritten (the entry is the commit point of prepare);
//   - a spec without an entry is removed (its prepare never committed; the kubelet retries);
//   - an entry whose claim is not found, or has another UID now, is unprepared.
//
// Claims that cannot be looked up for other reasons are kept: deleting a prepared claim of a
// running pod because the API server was briefly unreachable would be worse than a late cleanup.
func (d *Driver) Reconcile(ctx context.Context, claims ClaimGetter) (*ReconcileResult, error) {
	logger := klog.FromContext(ctx)
	unlock, err := d.lockState()
	if err != nil {
		return nil, err
	}
	defer unlock()

	res := &ReconcileResult{}
	if err := d.store.RemoveStaleTemps(); err != nil {
		logger.Error(err, "Removing stale checkpoint temp files failed")
	}
	data, rebuilt, err := d.loadState(ctx)
	if err != nil {
		return nil, err
	}
	if rebuilt != nil {
		res.Corrupt, res.Recovered, res.RemovedOrphans = rebuilt.corrupt, rebuilt.recovered, rebuilt.removed
	}
	changed := d.forgetEarlierBoot(ctx, data, res)
	if err := d.matchSpecs(data, res); err != nil {
		return nil, err
	}
	if claims != nil && d.dropGoneClaims(ctx, claims, data, res) {
		changed = true
	}
	if changed {
		if err := d.saveCheckpoint(data); err != nil {
			return nil, fmt.Errorf("reconcile: %w", err)
		}
	}
	for _, uid := range res.Unprepared {
		if err := d.cdi.Remove(uid); err != nil {
			return nil, err
		}
	}
	res.Prepared = len(data.Claims)
	d.recordPrepared(data)
	logger.Info("Reconciled prepared claims", "prepared", res.Prepared, "recovered", len(res.Recovered),
		"restoredSpecs", len(res.RestoredSpecs), "removedOrphans", len(res.RemovedOrphans), "unprepared", len(res.Unprepared),
		"rebooted", len(res.Rebooted))
	return res, nil
}

// forgetEarlierBoot empties data when it was written before the node's last reboot: no claim is
// prepared after a reboot. It reports whether it changed data.
func (d *Driver) forgetEarlierBoot(ctx context.Context, data *checkpoint.Data, res *ReconcileResult) bool {
	if !d.store.FromEarlierBoot(data) {
		return false
	}
	for uid := range data.Claims {
		res.Rebooted = append(res.Rebooted, uid)
	}
	klog.FromContext(ctx).Info("Node rebooted since the checkpoint was written; its claims are no longer prepared",
		"checkpointBoot", data.BootID, "currentBoot", d.store.BootID(), "claims", len(res.Rebooted))
	clear(data.Claims)
	return true
}

// matchSpecs makes the CDI specs match the entries: an entry without its spec gets it rewritten,
// a spec without an entry is removed.
func (d *Driver) matchSpecs(data *checkpoint.Data, res *ReconcileResult) error {
	specs, err := d.cdi.List()
	if err != nil {
		return err
	}
	haveSpec := make(map[types.UID]bool, len(specs))
	for _, uid := range specs {
		haveSpec[uid] = true
	}
	for uid, c := range data.Claims {
		if !haveSpec[uid] {
			if err := d.cdi.Write(c); err != nil {
				return err
			}
			res.RestoredSpecs = append(res.RestoredSpecs, uid)
		}
	}
	for _, uid := range specs {
		if _, ok := data.Claims[uid]; !ok {
			if err := d.cdi.Remove(uid); err != nil {
				return err
			}
			res.RemovedOrphans = append(res.RemovedOrphans, uid)
		}
	}
	return nil
}

// dropGoneClaims removes the entries whose claim is not found or has another UID now, listing
// them in res.Unprepared (their specs go once the checkpoint is saved). It reports whether it
// changed data.
func (d *Driver) dropGoneClaims(ctx context.Context, claims ClaimGetter, data *checkpoint.Data, res *ReconcileResult) bool {
	changed := false
	for uid, c := range data.Claims {
		current, err := claims.ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err), err == nil && current.UID != uid:
		case err != nil:
			klog.FromContext(ctx).Error(err, "Cannot check whether prepared claim still exists; keeping it", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
			continue
		default:
			continue
		}
		delete(data.Claims, uid)
		changed = true
		res.Unprepared = append(res.Unprepared, uid)
	}
	return changed
}

// rebuilt says what loadState recovered from the CDI specs.
type rebuilt struct {
	corrupt   *checkpoint.CorruptError
	recovered []types.UID
	// removed are specs that name no claim this plugin can recover.
	removed []types.UID
}

// loadState reads what is prepared: the checkpoint, or, when the store finds it corrupt and moves
// it aside, the CDI specs, each of which carries its claim's checkpoint entry (see package cdi).
// Until that rebuild is saved, what is prepared is unknown, and nothing may be answered: a lost
// checkpoint taken for an empty one lets a second claim have a GPU that a running container holds,
// and makes every spec prepared before it look like an orphan on the next start. It is the one path
// from unknown to known state, at start (Reconcile) and whenever any read (a prepare, an unprepare,
// the health path) finds the checkpoint damaged; callers hold d.stateMu, and the serialization file
// lock where the helper uses one (lockState).
func (d *Driver) loadState(ctx context.Context) (*checkpoint.Data, *rebuilt, error) {
	data, err := d.store.Load()
	if err == nil {
		return data, nil, nil
	}
	d.metrics.Error(metrics.ComponentCheckpoint)
	var corrupt *checkpoint.CorruptError
	if !errors.As(err, &corrupt) || data == nil {
		return nil, nil, err
	}
	logger := klog.FromContext(ctx)
	logger.Error(corrupt, "Checkpoint is corrupt; rebuilding from CDI specs", "path", corrupt.Path, "movedTo", corrupt.MovedTo)
	specs, err := d.cdi.List()
	if err != nil {
		return nil, nil, err
	}
	r := &rebuilt{corrupt: corrupt}
	for _, uid := range specs {
		c, err := d.cdi.Read(uid)
		if err != nil {
			logger.Error(err, "Unreadable CDI spec cannot be recovered; removing it", "uid", uid)
			if err := d.cdi.Remove(uid); err != nil {
				return nil, nil, err
			}
			r.removed = append(r.removed, uid)
			continue
		}
		data.Claims[uid] = c
		r.recovered = append(r.recovered, uid)
	}
	if err := d.saveCheckpoint(data); err != nil {
		return nil, nil, fmt.Errorf("rebuild from CDI specs: %w", err)
	}
	logger.Info("Rebuilt prepared claims from CDI specs", "recovered", len(r.recovered), "removedUnreadable", len(r.removed))
	return data, r, nil
}

// lockState takes the serialization file lock, which the helper holds during each prepare and
// unprepare when it serializes across instances (rolling update), and then d.stateMu, which
// serializes this process whichever lock the helper uses: for every path that uses the checkpoint
// but is not a call from the kubelet. Prepare and unprepare take only d.stateMu (the helper already
// holds the file lock, and a second lock of it would wait for itself); the order, file lock first,
// is theirs too.
func (d *Driver) lockState() (func(), error) {
	unlock, err := lock(filepath.Join(filepath.Dir(d.store.Path()), LockFileName))
	if err != nil {
		return nil, err
	}
	d.stateMu.Lock()
	return func() {
		d.stateMu.Unlock()
		unlock()
	}, nil
}

func lock(path string) (func(), error) {
	f, err := fileutil.LockFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { _ = f.Close() }, nil
}

// PreparedClaims lists what is prepared, for the health path, the status resync and diagnostics:
// under the same locks as a kubelet call, and rebuilt from the CDI specs if this read is the one
// that finds the checkpoint damaged. A read that only reported the damage would leave the next
// prepare an empty checkpoint: a running claim's GPU given to another claim, and its CDI spec
// removed as an orphan at the next start.
func (d *Driver) PreparedClaims(ctx context.Context) (map[types.UID]checkpoint.PreparedClaim, error) {
	unlock, err := d.lockState()
	if err != nil {
		return nil, err
	}
	defer unlock()
	data, err := d.loadCheckpoint(ctx)
	if err != nil {
		return nil, err
	}
	return data.Claims, nil
}
