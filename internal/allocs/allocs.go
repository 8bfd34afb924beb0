// Package allocs measures what a piece of code allocates, in bytes: the cost a test can bound
// deterministically, unlike the time it takes.
package allocs

import (
	"math"
	"runtime"
	"time"
)

// Bytes is the bytes allocated while fn runs (by any goroutine: run it where little else does).
func Bytes(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Retained is the heap that what build returns holds. The garbage build leaves may hold more
// until the cleanups of the objects it dropped have run, so it collects until the heap stops
// shrinking, before and after.
func Retained(build func() any) int64 {
	before := settledHeap()
	kept := build()
	after := settledHeap()
	runtime.KeepAlive(kept)
	return after - before
}

func settledHeap() int64 {
	var m runtime.MemStats
	last := int64(math.MaxInt64)
	for range 20 {
		runtime.GC()
		runtime.ReadMemStats(&m)
		if h := int64(m.HeapAlloc); h < last-last/1000 {
			last = h
			time.Sleep(10 * time.Millisecond)
			continue
		}
		break
	}
	return int64(m.HeapAlloc)
}
