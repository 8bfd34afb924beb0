package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

const testBoot = "boot-1"

// newStore pins the boot ID so that the content of a checkpoint does not depend on the machine.
func newStore(dir string) *Store { return NewStore(dir, WithBootID(testBoot)) }

func sample() *Data {
	return &Data{BootID: testBoot, Claims: map[types.UID]PreparedClaim{
		"uid-1": {UID: "uid-1", Namespace: "ns", Name: "c1", Devices: []PreparedDevice{
			{Request: "gpu", Pool: "node-a", Device: "gpu-1", Index: 1, Sharing: Sharing{Strategy: "TimeSlicing", TimeSliceInterval: "Default"}, CDIDevice: "uid-1-gpu-1"},
		}},
	}}
}

func TestRoundTrip(t *testing.T) {
	s := newStore(t.TempDir())
	empty, err := s.Load()
	if err != nil || len(empty.Claims) != 0 {
		t.Fatalf("Load of missing checkpoint = %v, %v; want empty", empty, err)
	}
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, sample()) {
		t.Errorf("Load = %+v, want %+v", got, sample())
	}
}

// Read sees what Load sees and leaves a damaged file where it is: it looks at a file the plugin owns.
func TestRead(t *testing.T) {
	s := newStore(t.TempDir())
	if got, err := Read(s.Path()); err != nil || len(got.Claims) != 0 {
		t.Fatalf("Read of a missing checkpoint = %v, %v; want empty", got, err)
	}
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(s.Path()); err != nil || !reflect.DeepEqual(got, sample()) {
		t.Errorf("Read = %+v, %v; want %+v", got, err, sample())
	}
	if err := os.WriteFile(s.Path(), []byte("{broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(s.Path()); err == nil || !strings.Contains(err.Error(), s.Path()) {
		t.Errorf("Read of a damaged file = %v, want an error naming it", err)
	}
	if raw, _ := os.ReadFile(s.Path()); string(raw) != "{broken" {
		t.Errorf("Read changed the damaged file: %q", raw)
	}
}

// TestSaveReplacesAtomically checks the mechanics that make Save crash-safe: the new content goes to
// a new inode that is renamed over the old name (a reader holding the old file keeps seeing the old
// content in full), and no temp file is left behind.
func TestSaveReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	s := newStore(dir)
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	old, err := os.Open(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = old.Close() }()
	oldInfo, _ := old.Stat()
	oldContent, _ := os.ReadFile(s.Path())

	next := sample()
	next.Claims["uid-2"] = PreparedClaim{UID: "uid-2", Namespace: "ns", Name: "c2"}
	if err := s.Save(next); err != nil {
		t.Fatal(err)
	}
	newInfo, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if os.SameFile(oldInfo, newInfo) {
		t.Error("Save wrote in place; a crash mid-write would leave a torn file")
	}
	stillOld := make([]byte, len(oldContent)+10)
	n, _ := old.ReadAt(stillOld, 0)
	if !bytes.Equal(stillOld[:n], oldContent) {
		t.Error("the old file's content changed under an open reader")
	}
	if oldInfo.Sys().(*syscall.Stat_t).Ino == newInfo.Sys().(*syscall.Stat_t).Ino {
		t.Error("same inode after Save")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d files after Save, want only the checkpoint: %v", len(entries), entries)
	}
}

// A crash between creating the temp file and the rename leaves a temp file and the previous
// checkpoint: Load must return the previous content, and the temp file is garbage.
func TestCrashBeforeRename(t *testing.T) {
	dir := t.TempDir()
	s := newStore(dir)
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "."+FileName+".12345.tmp")
	if err := os.WriteFile(tmp, []byte(`{"version":"gpu.example.com/checkpoint/v2","chec`), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load()
	if err != nil || !reflect.DeepEqual(got, sample()) {
		t.Fatalf("Load after crash = %+v, %v; want the previous checkpoint", got, err)
	}
	if err := s.RemoveStaleTemps(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temp file still there: %v", err)
	}
}

func TestCorrupt(t *testing.T) {
	valid := func() []byte {
		dir := t.TempDir()
		s := newStore(dir)
		if err := s.Save(sample()); err != nil {
			t.Fatal(err)
		}
		raw, _ := os.ReadFile(s.Path())
		return raw
	}()
	var f file
	_ = json.Unmarshal(valid, &f)
	tampered := strings.Replace(string(valid), "gpu-1", "gpu-2", 1)
	badVersion, _ := json.Marshal(file{Version: "v0", Checksum: f.Checksum, Data: f.Data})
	mismatch := []byte(`{"claims":{"a":{"uid":"b","namespace":"ns","name":"c","devices":null}}}`)
	badEntry, _ := json.Marshal(file{Version: version, Checksum: checksum(mismatch), Data: mismatch})
	badShape := []byte(`{"claims":{"a":{"devices":{}}}}`)
	badData, _ := json.Marshal(file{Version: version, Checksum: checksum(badShape), Data: badShape})

	tests := []struct {
		name    string
		content []byte
		reason  string
	}{
		{"truncated", valid[:len(valid)/2], "not JSON"},
		{"empty file", nil, "not JSON"},
		{"garbage", []byte("\x00\x01garbage"), "not JSON"},
		{"tampered content", []byte(tampered), "checksum"},
		{"unknown version", badVersion, "version"},
		{"entry under another UID", badEntry, "holds claim UID"},
		{"data of the wrong shape", badData, "data: json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := newStore(dir)
			s.now = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC) }
			if err := os.WriteFile(s.Path(), tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			data, err := s.Load()
			var corrupt *CorruptError
			if !errors.As(err, &corrupt) {
				t.Fatalf("Load = %v, want a CorruptError", err)
			}
			if !strings.Contains(err.Error(), s.Path()) || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("error %q should name %s and say %q", err, s.Path(), tc.reason)
			}
			wantMoved := s.Path() + ".corrupt-20260102T030405.000000006Z"
			if corrupt.MovedTo != wantMoved {
				t.Errorf("moved to %q, want %q", corrupt.MovedTo, wantMoved)
			}
			if kept, err := os.ReadFile(wantMoved); err != nil || !bytes.Equal(kept, tc.content) {
				t.Errorf("corrupt file not preserved: %v", err)
			}
			if _, err := os.Stat(s.Path()); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("corrupt checkpoint still in place: %v", err)
			}
			if data == nil || len(data.Claims) != 0 {
				t.Errorf("data = %+v, want empty (never trust a corrupt checkpoint)", data)
			}
			// A later Save must not touch the evidence.
			if err := s.Save(sample()); err != nil {
				t.Fatal(err)
			}
			if kept, _ := os.ReadFile(wantMoved); !bytes.Equal(kept, tc.content) {
				t.Error("Save overwrote the moved-aside corrupt checkpoint")
			}
		})
	}
}

// FuzzLoad: whatever bytes are on disk, Load never panics and either trusts them (they carry a valid
// checksum) or moves them aside.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(`{"version":"gpu.example.com/checkpoint/v2","checksum":"x","data":{}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		s := newStore(t.TempDir())
		if err := os.WriteFile(s.Path(), raw, 0o600); err != nil {
			t.Fatal(err)
		}
		data, err := s.Load()
		var corrupt *CorruptError
		switch {
		case err == nil:
			if data == nil || data.Claims == nil {
				t.Fatal("nil data without error")
			}
		case errors.As(err, &corrupt):
			if _, statErr := os.Stat(s.Path()); !errors.Is(statErr, os.ErrNotExist) {
				t.Fatal("corrupt checkpoint left in place")
			}
		default:
			t.Fatalf("unexpected error: %v", err)
		}
	})
}

// Two stores on one directory are two plugin instances during a rolling update: each must see the
// other's saves although it caches what it read.
func TestCacheSeesOtherWriters(t *testing.T) {
	dir := t.TempDir()
	a, b := newStore(dir), newStore(dir)
	if err := a.Save(sample()); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Load(); err != nil || len(got.Claims) != 1 {
		t.Fatalf("Load = %v, %v", got, err)
	}
	next := sample()
	next.Claims["uid-2"] = PreparedClaim{UID: "uid-2", Namespace: "ns", Name: "c2"}
	if err := b.Save(next); err != nil {
		t.Fatal(err)
	}
	got, err := a.Load()
	if err != nil || !reflect.DeepEqual(got, next) {
		t.Fatalf("after the other instance saved: %+v, %v; want %+v", got, err, next)
	}
	// Callers mutate what Load returns; that must not leak into the cache.
	delete(got.Claims, "uid-1")
	if again, _ := a.Load(); len(again.Claims) != 2 {
		t.Errorf("cache was modified through a returned map: %v", again.Claims)
	}
	// Damage behind the cache's back with a different size is noticed.
	if err := os.WriteFile(a.Path(), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	var corrupt *CorruptError
	if _, err := a.Load(); !errors.As(err, &corrupt) {
		t.Errorf("Load after in-place damage = %v, want CorruptError", err)
	}
}

// The boot ID decides whether the recorded claims are still prepared; see the package doc for why
// that makes fsync unnecessary.
func TestFromEarlierBoot(t *testing.T) {
	tests := []struct {
		name             string
		writer, reader   string
		wantEarlier      bool
		wantRecordedBoot string
	}{
		{name: "same boot", writer: "boot-1", reader: "boot-1", wantRecordedBoot: "boot-1"},
		{name: "rebooted", writer: "boot-1", reader: "boot-2", wantEarlier: true, wantRecordedBoot: "boot-1"},
		{name: "reader without boot ID", writer: "boot-1", reader: "", wantRecordedBoot: "boot-1"},
		{name: "writer without boot ID", writer: "", reader: "boot-2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := NewStore(dir, WithBootID(tc.writer)).Save(sample()); err != nil {
				t.Fatal(err)
			}
			r := NewStore(dir, WithBootID(tc.reader))
			data, err := r.Load()
			if err != nil {
				t.Fatal(err)
			}
			if data.BootID != tc.wantRecordedBoot {
				t.Errorf("recorded boot = %q, want %q", data.BootID, tc.wantRecordedBoot)
			}
			if got := r.FromEarlierBoot(data); got != tc.wantEarlier {
				t.Errorf("FromEarlierBoot = %v, want %v", got, tc.wantEarlier)
			}
		})
	}
}

func TestNewStoreReadsKernelBootID(t *testing.T) {
	raw, err := os.ReadFile(bootIDPath)
	if err != nil {
		t.Skipf("no kernel boot ID on this system (%v); saves are fsynced instead", err)
	}
	s := NewStore(t.TempDir())
	if want := strings.TrimSpace(string(raw)); s.BootID() != want || want == "" {
		t.Errorf("BootID = %q, want %q", s.BootID(), want)
	}
}

func TestEncodeClaim(t *testing.T) {
	c := sample().Claims["uid-1"]
	s, err := EncodeClaim(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeClaim(s)
	if err != nil || !reflect.DeepEqual(back, c) {
		t.Errorf("DecodeClaim(EncodeClaim(c)) = %+v, %v; want %+v", back, err, c)
	}
	for _, bad := range []string{"", "{", `{"version":"gpu.example.com/checkpoint/v0","claim":{"uid":"u"}}`, `{"claim":{"uid":"u"}}`} {
		if _, err := DecodeClaim(bad); err == nil {
			t.Errorf("DecodeClaim(%q) succeeded", bad)
		}
	}
}
