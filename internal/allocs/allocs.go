// Package allocs measures what a piece of code allocates, in bytes: the cost a test can bound
// deterministically, unlike the time it takes.
package allocs

import "runtime"

// Bytes is the bytes allocated while fn runs (by any goroutine: run it where little else does).
func Bytes(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
