package ladder

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestBlocksShareExactlyTheCommonPrefix(t *testing.T) {
	a := Blocks("m", "", []byte(strings.Repeat("a", 64)+strings.Repeat("b", 64)), 32, 100)
	b := Blocks("m", "", []byte(strings.Repeat("a", 64)+strings.Repeat("c", 64)), 32, 100)
	if len(a) != 4 || len(b) != 4 {
		t.Fatalf("whole blocks only: %d %d", len(a), len(b))
	}
	if a[0] != b[0] || a[1] != b[1] || a[2] == b[2] || a[3] == b[3] {
		t.Fatal("blocks must agree exactly up to the first difference, and never after it")
	}
	if s := Blocks("m", "pck1-x", []byte(strings.Repeat("a", 64)), 32, 100); s[0] == a[0] {
		t.Fatal("another scope (salt) shares nothing")
	}
	if o := Blocks("other", "", []byte(strings.Repeat("a", 64)), 32, 100); o[0] == a[0] {
		t.Fatal("another model shares nothing")
	}
	if n := len(Blocks("m", "", []byte(strings.Repeat("a", 1000)), 32, 5)); n != 5 {
		t.Fatalf("at most maxBlocks, got %d", n)
	}
	if Blocks("m", "", []byte("short"), 32, 5) != nil && len(Blocks("m", "", []byte("short"), 32, 5)) != 0 {
		t.Fatal("a prompt shorter than a block has no blocks")
	}
}

func TestWindowSeesRepeatsWithinTheSpanOnly(t *testing.T) {
	w := NewWindow(time.Minute, 1000)
	t0 := time.Unix(0, 0)
	x := []uint64{1, 2, 3, 4}
	if got := w.Observe(x, t0); got != 0 {
		t.Fatalf("first sight: %d", got)
	}
	if got := w.Observe([]uint64{1, 2, 9, 4}, t0.Add(time.Second)); got != 2 {
		t.Fatalf("a prefix, not any block: %d", got)
	}
	if got := w.Observe(x, t0.Add(90*time.Second)); got != 4 {
		t.Fatalf("the previous generation still counts: %d", got)
	}
	if got := w.Observe(x[:1], t0.Add(200*time.Second)); got != 1 {
		t.Fatalf("seen at 90 s, in the generation before: %d", got)
	}
	if got := w.Observe([]uint64{2}, t0.Add(400*time.Second)); got != 0 {
		t.Fatalf("beyond two spans it is forgotten: %d", got)
	}
}

func TestWindowMemoryIsBounded(t *testing.T) {
	w := NewWindow(time.Hour, 100)
	now := time.Unix(0, 0)
	for i := uint64(0); i < 10_000; i++ {
		w.Observe([]uint64{i, i + 1_000_000}, now)
	}
	if w.Len() > 200 {
		t.Fatalf("two generations of at most 100, held %d", w.Len())
	}
	if w.Rotated == 0 {
		t.Fatal("a flood rotates early")
	}
}

func TestLRUHoldsWhatFitsAndEvictsTheLeastRecent(t *testing.T) {
	l := NewLRU(1000)
	a, b := []uint64{1, 2, 3}, []uint64{10, 11, 12}
	if got := l.Observe(a, 6); got != 0 {
		t.Fatal(got)
	}
	l.Observe(b, 6)
	if got := l.Observe(a, 6); got != 3 {
		t.Fatalf("both fit in 6 blocks: %d", got)
	}
	l.Observe([]uint64{20, 21, 22}, 6) // evicts b, the least recently used
	if got := l.Observe(b, 6); got != 0 {
		t.Fatalf("b was evicted: %d", got)
	}
	if got := l.Observe([]uint64{20, 21, 22}, 6); got != 3 {
		t.Fatalf("b's return evicted a, the least recent, not the third prompt: %d", got)
	}
	if got := l.Observe(a, 6); got != 0 {
		t.Fatalf("a was evicted: %d", got)
	}
	if l.Len() != 6 {
		t.Fatalf("held %d", l.Len())
	}
	l.Observe(nil, 2) // the pool shrank
	if l.Len() != 2 {
		t.Fatalf("a smaller pool holds less: %d", l.Len())
	}
}

func TestLRULimit(t *testing.T) {
	l := NewLRU(50)
	for i := uint64(0); i < 1000; i++ {
		l.Observe([]uint64{i}, 1_000_000)
	}
	if l.Len() != 50 || len(l.keys) > 50 {
		t.Fatalf("at most the limit: %d (%d slots)", l.Len(), len(l.keys))
	}
}

func BenchmarkBlocks(b *testing.B) {
	input := []byte(strings.Repeat("x", 32<<10))
	for i := 0; i < b.N; i++ {
		Blocks("m", "", input, 64, 2048)
	}
}

func BenchmarkObserve(b *testing.B) {
	input := []byte(strings.Repeat("x", 32<<10))
	w, l := NewWindow(time.Minute, 1<<18), NewLRU(1<<18)
	now := time.Unix(0, 0)
	for i := 0; i < b.N; i++ {
		h := Blocks("m", "", input, 64, 2048)
		w.Observe(h, now)
		l.Observe(h, 1<<17)
	}
}

func TestTrackedIsEveryStrideThBlockAndTheLast(t *testing.T) {
	cases := []struct {
		total, stride int
		want          []int
	}{
		{0, 4, nil}, {1, 4, []int{0}}, {3, 4, []int{2}}, {4, 4, []int{3}}, {7, 4, []int{3, 6}},
		{8, 4, []int{3, 7}}, {9, 4, []int{3, 7, 8}}, {3, 1, []int{0, 1, 2}}, {3, 0, []int{0, 1, 2}},
	}
	for _, c := range cases {
		if got := Tracked(c.total, c.stride); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("Tracked(%d, %d) = %v, want %v", c.total, c.stride, got, c.want)
		}
	}
}

// For every prompt length and every true shared prefix, what a rung credits is within
// half a stride of the truth once a tracked block was found (nothing before that: less
// than a stride shared), exact when nothing or everything is shared, and never more than
// the prompt.
func TestCreditedIsWithinHalfAStrideOfTheTruth(t *testing.T) {
	for stride := 1; stride <= 8; stride++ {
		for total := 1; total <= 40; total++ {
			tracked := Tracked(total, stride)
			for shared := 0; shared <= total; shared++ {
				found := 0 // a tracked block is found when the whole prefix up to it is shared
				for found < len(tracked) && tracked[found] < shared {
					found++
				}
				got := Credited(tracked, found)
				if got < 0 || got > total {
					t.Fatalf("stride %d, %d blocks, %d shared: credited %d", stride, total, shared, got)
				}
				if (shared == 0 || shared == total) && got != shared {
					t.Fatalf("stride %d, %d blocks, %d shared: credited %d, want exact", stride, total, shared, got)
				}
				if found == 0 { // no tracked block found: no evidence, nothing credited
					if got != 0 || shared > tracked[0] {
						t.Fatalf("stride %d, %d blocks, %d shared: credited %d", stride, total, shared, got)
					}
					continue
				}
				if diff := got - shared; diff > stride/2 || -diff > stride/2 {
					t.Fatalf("stride %d, %d blocks, %d shared: credited %d, more than half a stride off", stride, total, shared, got)
				}
			}
		}
	}
}
