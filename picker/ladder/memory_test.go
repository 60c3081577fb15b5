package ladder

import (
	"runtime"
	"testing"
	"time"
)

func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// The bounds' memory, at the defaults the plugin uses (2^18 hashes per generation, 2^18 in
// the LRU), filled to them: what README.md and docs/monitoring.md quote.
func TestMemoryAtTheBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a quarter million entries")
	}
	const limit = 1 << 18
	before := heap()
	w := NewWindow(time.Hour, limit)
	now := time.Unix(0, 0)
	for i := uint64(0); i < 3*limit; i += 64 {
		hashes := make([]uint64, 64)
		for j := range hashes {
			hashes[j] = i + uint64(j)
		}
		w.Observe(hashes, now)
	}
	window := heap() - before
	before = heap()
	l := NewLRU(limit)
	for i := uint64(0); i < 2*limit; i += 64 {
		hashes := make([]uint64, 64)
		for j := range hashes {
			hashes[j] = i + uint64(j)
		}
		l.Observe(hashes, limit)
	}
	lru := heap() - before
	t.Logf("window (2 x %d hashes): %.1f MiB; LRU (%d blocks): %.1f MiB", limit, float64(window)/(1<<20), limit, float64(lru)/(1<<20))
	if w.Len() > 2*limit || l.Len() > limit {
		t.Fatalf("over the bounds: %d, %d", w.Len(), l.Len())
	}
	if window > 40<<20 || lru > 40<<20 {
		t.Fatalf("more memory than the bounds allow for: %d, %d bytes", window, lru)
	}
	runtime.KeepAlive(w)
	runtime.KeepAlive(l)
}
