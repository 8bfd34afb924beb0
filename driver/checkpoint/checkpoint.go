// Package checkpoint persists the claims this plugin has prepared, so that a restarted plugin (or
// its rolling-update successor) answers prepare and unprepare exactly as before. The file is
// replaced atomically and carries a checksum: a crash leaves either the old or the new file, and a
// damaged file is detected, reported and moved aside instead of being trusted or overwritten.
//
// Prepared state lives as long as the kernel boot: CDI specs sit on tmpfs, devices are reset and no
// container survives a reboot, and the kubelet prepares every claim again after it restarts (claims
// restored from its own checkpoint start unprepared: pkg/kubelet/cm/dra/claiminfo.go). So the
// checkpoint records the boot it was written in and is not fsynced: a process crash keeps the page
// cache, and the only writes that can be lost (kernel crash, power loss) belong to a boot whose
// entries are discarded anyway. That keeps the disk's fsync latency, which dominated prepare, out
// of the kubelet's critical path. Without a boot ID (not Linux) every save is fsynced.
//
// An entry is a PreparedClaim, this package's own type, and the file names its format version.
// Load reads each version in decoders, converting it to the current one; Save writes the current
// one, so an older file is replaced by the first save after an upgrade. A format change adds the
// previous version's decoder there. A plugin that does not know a file's version treats it as
// corrupt and rebuilds from the CDI specs, which is what keeps a rollback working.
package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// FileName is the checkpoint's name in the plugin data directory.
const FileName = "checkpoint.json"

// Data is the content of a checkpoint: the prepared claims by UID.
type Data struct {
	// BootID is the kernel boot the claims were prepared in (empty where the kernel has none).
	BootID string                      `json:"bootID,omitempty"`
	Claims map[types.UID]PreparedClaim `json:"claims"`
}

// bootIDPath holds a random ID the Linux kernel generates on every boot.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

type file struct {
	Version  string          `json:"version"`
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// CorruptError says the checkpoint could not be trusted and where the damaged file was moved.
type CorruptError struct {
	Path      string
	MovedTo   string
	Reason    error
	MoveError error
}

func (e *CorruptError) Error() string {
	if e.MoveError != nil {
		return fmt.Sprintf("checkpoint %s is corrupt (%v) and could not be moved aside: %v", e.Path, e.Reason, e.MoveError)
	}
	return fmt.Sprintf("checkpoint %s is corrupt (%v); moved aside to %s", e.Path, e.Reason, e.MovedTo)
}

func (e *CorruptError) Unwrap() error { return e.Reason }

// Store reads and writes one checkpoint file. It is not safe for concurrent use: its user holds
// one lock around every Load and Save, also the reads outside prepare and unprepare (the plugin's
// health path), since the Load that finds the file damaged moves it aside and only that caller can
// rebuild it. The kubelet plugin helper serializes prepare and unprepare (across instances, with a
// file lock, during rolling updates), and each call loads the file fresh, so two instances never
// work on stale state.
type Store struct {
	path   string
	now    func() time.Time
	bootID string

	// cached is the content last read or written, valid while the file is the same inode with the
	// same size and mtime. Every Save renames a new inode into place, so a write by another plugin
	// instance (rolling update) always misses the cache. Decoding dominated the cost of a prepare.
	cached    *Data
	cachedKey fileKey
}

// Option configures a Store.
type Option func(*Store)

// WithBootID overrides the boot ID read from the kernel (tests simulate reboots with it; an empty
// ID makes every save durable).
func WithBootID(id string) Option { return func(s *Store) { s.bootID = id } }

type fileKey struct {
	ino   uint64
	size  int64
	mtime time.Time
}

func keyOf(info os.FileInfo) fileKey {
	k := fileKey{size: info.Size(), mtime: info.ModTime()}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		k.ino = st.Ino
	}
	return k
}

// NewStore returns the store of the checkpoint in dir.
func NewStore(dir string, opts ...Option) *Store {
	s := &Store{path: filepath.Join(dir, FileName), now: time.Now}
	if id, err := os.ReadFile(bootIDPath); err == nil {
		s.bootID = strings.TrimSpace(string(id))
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// BootID is the boot this store records in every save.
func (s *Store) BootID() string { return s.bootID }

// FromEarlierBoot says whether data was written before the node last rebooted, so none of its
// claims is prepared any more.
func (s *Store) FromEarlierBoot(data *Data) bool {
	return data.BootID != "" && s.bootID != "" && data.BootID != s.bootID
}

// Path is the checkpoint file.
func (s *Store) Path() string { return s.path }

// Load reads the checkpoint. A missing file is an empty checkpoint. A file that does not parse, has
// an unknown version or a wrong checksum is renamed to <path>.corrupt-<timestamp> and reported as a
// *CorruptError together with an empty checkpoint, so the caller can rebuild state from elsewhere.
func (s *Store) Load() (*Data, error) {
	empty := &Data{BootID: s.bootID, Claims: map[types.UID]PreparedClaim{}}
	f, err := os.Open(s.path)
	if errors.Is(err, os.ErrNotExist) {
		s.cached = nil
		return empty, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint %s: %w", s.path, err)
	}
	defer func() { _ = f.Close() }()
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat checkpoint %s: %w", s.path, err)
	}
	if s.cached != nil && keyOf(info) == s.cachedKey {
		// Callers add and delete entries; they get their own map.
		return &Data{BootID: s.cached.BootID, Claims: maps.Clone(s.cached.Claims)}, nil
	}
	raw, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint %s: %w", s.path, err)
	}
	data, reason := decode(raw)
	if reason == nil {
		s.cached, s.cachedKey = &Data{BootID: data.BootID, Claims: maps.Clone(data.Claims)}, keyOf(info)
		return data, nil
	}
	s.cached = nil
	corrupt := &CorruptError{Path: s.path, Reason: reason}
	corrupt.MovedTo = fmt.Sprintf("%s.corrupt-%s", s.path, s.now().UTC().Format("20060102T150405.000000000Z"))
	if err := os.Rename(s.path, corrupt.MovedTo); err != nil {
		corrupt.MovedTo = ""
		corrupt.MoveError = err
		// Still corrupt and still in place: refuse to work on it, a later Save would overwrite the
		// evidence.
		return nil, corrupt
	}
	if err := syncDir(filepath.Dir(s.path)); err != nil {
		return nil, fmt.Errorf("sync %s after moving corrupt checkpoint: %w", filepath.Dir(s.path), err)
	}
	return empty, corrupt
}

// Read returns the checkpoint at path as Load would, but never moves a damaged file aside and keeps
// no cache: for tools and tests that look at a node's state while the plugin owns it. A missing
// file is an empty checkpoint.
func Read(path string) (*Data, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &Data{Claims: map[types.UID]PreparedClaim{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint %s: %w", path, err)
	}
	data, err := decode(raw)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return data, nil
}

func decode(raw []byte) (*Data, error) {
	var f file
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	decodeData, ok := decoders[f.Version]
	if !ok {
		return nil, fmt.Errorf("version %q, want one of %q", f.Version, slices.Sorted(maps.Keys(decoders)))
	}
	if got := checksum(f.Data); got != f.Checksum {
		return nil, fmt.Errorf("checksum %q does not match content (%q)", f.Checksum, got)
	}
	data, err := decodeData(f.Data)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if data.Claims == nil {
		data.Claims = map[types.UID]PreparedClaim{}
	}
	for uid, c := range data.Claims {
		if c.UID != uid {
			return nil, fmt.Errorf("entry %s holds claim UID %q", uid, c.UID)
		}
	}
	return data, nil
}

// decoders read the data of each format version Load knows into the current Data.
var decoders = map[string]func(json.RawMessage) (*Data, error){
	version: func(raw json.RawMessage) (*Data, error) {
		data := &Data{}
		return data, json.Unmarshal(raw, data)
	},
}

func checksum(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Save replaces the checkpoint atomically (a temp file in the same directory renamed over it) and
// stamps it with the current boot. It fsyncs only when there is no boot ID (see the package doc).
func (s *Store) Save(data *Data) error {
	data.BootID = s.bootID
	payload, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	// Assembled by hand: marshaling payload as a json.RawMessage would validate and compact it
	// again, which cost as much as encoding it.
	raw := make([]byte, 0, len(payload)+128)
	raw = fmt.Appendf(raw, `{"version":%q,"checksum":%q,"data":`, version, checksum(payload))
	raw = append(raw, payload...)
	raw = append(raw, '}')
	s.cached = nil
	info, err := writeAtomically(s.path, raw, s.bootID == "")
	if err != nil {
		return err
	}
	s.cached, s.cachedKey = &Data{BootID: data.BootID, Claims: maps.Clone(data.Claims)}, keyOf(info)
	return nil
}

func writeAtomically(path string, data []byte, durable bool) (info os.FileInfo, retErr error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return nil, fmt.Errorf("create temp file for %s: %w", path, err)
	}
	defer func() {
		if retErr != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return nil, fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			return nil, fmt.Errorf("fsync %s: %w", tmp.Name(), err)
		}
	}
	info, err = tmp.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return nil, fmt.Errorf("rename %s to %s: %w", tmp.Name(), path, err)
	}
	if durable {
		if err := syncDir(dir); err != nil {
			return nil, fmt.Errorf("fsync directory %s: %w", dir, err)
		}
	}
	return info, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		return errors.Join(err, d.Close())
	}
	return d.Close()
}

// RemoveStaleTemps deletes temp files a crash left between create and rename. They are never read,
// so this only keeps the directory tidy.
func (s *Store) RemoveStaleTemps() error {
	matches, err := filepath.Glob(filepath.Join(filepath.Dir(s.path), "."+filepath.Base(s.path)+".*.tmp"))
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range matches {
		if err := os.Remove(m); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
