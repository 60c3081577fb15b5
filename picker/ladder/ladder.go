// Package ladder is the plain-Go half of the hit-ratio ladder's first two rungs (issue 39):
// per request, how many of the prompt's prefix blocks a perfect, infinitely large cache
// would have held (the workload rung: seen before in this window, in this scope) and how
// many a cache of the pool's real KV size would have held (the capacity rung: an LRU
// simulation). The picker is where both are measured, because it alone sees every request
// of the pool: a per-pod figure would count a prefix seen on another pod as new, and so
// charge a routing loss to the workload.
//
// Memory is bounded: the window holds at most 2 x WindowCap block hashes (two
// generations) and the LRU at most LRUCap; README.md says what that costs and the error it
// brings. It imports nothing of GIE.
package ladder

import (
	"encoding/binary"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Blocks splits input into whole blocks of blockChars bytes (at most maxBlocks) and
// hashes each with the one before it, the first seeded with the model and the cache salt:
// two prompts share a block hash only when they share the whole prefix up to it, in one
// model and one isolation scope. (GIE's producer cuts the same blocks, blockTokens x 4
// characters of the same input; these are this package's own hashes of them.)
func Blocks(model, salt string, input []byte, blockChars, maxBlocks int) []uint64 {
	if blockChars <= 0 || maxBlocks <= 0 {
		return nil
	}
	n := min(len(input)/blockChars, maxBlocks)
	out := make([]uint64, 0, n)
	seed := make([]byte, 0, len(model)+1+len(salt))
	seed = append(append(append(seed, model...), 0), salt...)
	prev := xxhash.Sum64(seed)
	var link [16]byte // the block before, then this block's own hash
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint64(link[:8], prev)
		binary.LittleEndian.PutUint64(link[8:], xxhash.Sum64(input[i*blockChars:(i+1)*blockChars]))
		prev = xxhash.Sum64(link[:])
		out = append(out, prev)
	}
	return out
}

// Tracked is which of a prompt's total blocks the rungs look up and store: every stride-th
// (indices stride-1, 2*stride-1, ...) and the last. A block's hash names the whole prefix
// up to it, so a tracked block found means every block before it was there too; tracking
// 1/stride of them bounds the work and the memory, and the last one makes a prompt seen
// whole (a retry, a shared document) count exactly, however short it is.
func Tracked(total, stride int) []int {
	if total <= 0 {
		return nil
	}
	stride = max(stride, 1)
	out := make([]int, 0, total/stride+1)
	for i := stride - 1; i < total; i += stride {
		out = append(out, i)
	}
	if len(out) == 0 || out[len(out)-1] != total-1 {
		out = append(out, total-1)
	}
	return out
}

// Credited is the blocks a rung credits a prompt with when the first found of its tracked
// blocks (Tracked) were there: all of them when all were (the last block names the whole
// prompt); none when the first was not (no evidence of any repeat); otherwise the true
// prefix ends between the last tracked block found and the first not found, and the
// middle of that gap is credited (rounded down). Once a tracked block was found the error
// is at most half a gap, stride/2 whole blocks, either way, where counting only the tracked blocks
// found would always undercount by up to stride-1 (on the short prompts of a chat, half of
// what a cache delivers); before that, less than a stride shared is credited as nothing.
func Credited(tracked []int, found int) int {
	switch {
	case found <= 0:
		return 0
	case found >= len(tracked):
		return tracked[len(tracked)-1] + 1
	}
	surely, atMost := tracked[found-1]+1, tracked[found]
	return (surely + atMost) / 2
}

// Window is the workload rung's perfect cache: every block hash seen in the last span to
// 2 x span (two generations of at most limit hashes each; a full generation starts the
// next early, so under a flood the window shortens rather than memory growing).
type Window struct {
	mu      sync.Mutex
	cur     map[uint64]struct{}
	prev    map[uint64]struct{}
	started time.Time
	span    time.Duration
	limit   int
	Rotated int // generations started early because the current one was full
}

// NewWindow is a window of generations of span, each of at most limit hashes.
func NewWindow(span time.Duration, limit int) *Window {
	return &Window{cur: map[uint64]struct{}{}, prev: map[uint64]struct{}{}, span: span, limit: limit}
}

// Observe returns how many leading blocks of hashes the window held, then adds them all.
func (w *Window) Observe(hashes []uint64, now time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started.IsZero() {
		w.started = now
	}
	if now.Sub(w.started) >= w.span || len(w.cur)+len(hashes) > w.limit {
		if now.Sub(w.started) < w.span {
			w.Rotated++
		}
		w.prev, w.cur, w.started = w.cur, make(map[uint64]struct{}, len(w.cur)), now
	}
	seen := len(hashes)
	for i, h := range hashes {
		_, a := w.cur[h]
		_, b := w.prev[h]
		if !a && !b {
			seen = i
			break
		}
	}
	for _, h := range hashes {
		if len(w.cur) >= w.limit {
			break
		}
		w.cur[h] = struct{}{}
	}
	return seen
}

// Len is the hashes held (both generations).
func (w *Window) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.cur) + len(w.prev)
}

// LRU is the capacity rung's cache: block hashes in least-recently-used order, in flat
// arrays (about 40 bytes a block with the index), at most limit blocks whatever the pool's
// KV size says.
type LRU struct {
	mu         sync.Mutex
	index      map[uint64]int32
	keys       []uint64
	prev, next []int32
	head, tail int32 // most and least recently used; -1 when empty
	free       []int32
	limit      int
}

// NewLRU is an empty cache that never holds more than limit blocks.
func NewLRU(limit int) *LRU {
	return &LRU{index: map[uint64]int32{}, head: -1, tail: -1, limit: limit}
}

// Len is the blocks held.
func (l *LRU) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.index)
}

// Observe returns how many leading blocks of hashes the cache held, then uses them all
// (vLLM's order: a request's blocks become the most recent), evicting the least recently
// used beyond capacity blocks (at most the limit).
func (l *LRU) Observe(hashes []uint64, capacity int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	capacity = min(capacity, l.limit)
	held := len(hashes)
	for i, h := range hashes {
		if _, ok := l.index[h]; !ok {
			held = i
			break
		}
	}
	if capacity <= 0 {
		return 0
	}
	for _, h := range hashes {
		if at, ok := l.index[h]; ok {
			l.unlink(at)
			l.pushFront(at)
			continue
		}
		for len(l.index) >= capacity {
			l.evict()
		}
		at := l.alloc(h)
		l.index[h] = at
		l.pushFront(at)
	}
	for len(l.index) > capacity {
		l.evict()
	}
	return held
}

func (l *LRU) alloc(h uint64) int32 {
	if n := len(l.free); n > 0 {
		at := l.free[n-1]
		l.free = l.free[:n-1]
		l.keys[at] = h
		return at
	}
	l.keys = append(l.keys, h)
	l.prev = append(l.prev, -1)
	l.next = append(l.next, -1)
	return int32(len(l.keys) - 1)
}

func (l *LRU) evict() {
	at := l.tail
	l.unlink(at)
	delete(l.index, l.keys[at])
	l.free = append(l.free, at)
}

func (l *LRU) unlink(at int32) {
	p, n := l.prev[at], l.next[at]
	if p >= 0 {
		l.next[p] = n
	} else {
		l.head = n
	}
	if n >= 0 {
		l.prev[n] = p
	} else {
		l.tail = p
	}
	l.prev[at], l.next[at] = -1, -1
}

func (l *LRU) pushFront(at int32) {
	l.prev[at], l.next[at] = -1, l.head
	if l.head >= 0 {
		l.prev[l.head] = at
	}
	l.head = at
	if l.tail < 0 {
		l.tail = at
	}
}
