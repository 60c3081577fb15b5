package sessions

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
)

var t0 = time.Unix(1_800_000_000, 0)

func TestPinLivesTTLAfterItsLastUse(t *testing.T) {
	s := NewStore[string](300*time.Second, 10)
	k := KeyOf("alice")
	s.Pin(k, "pod-a", t0)
	if pod, ok := s.Pinned(k, t0.Add(299*time.Second)); !ok || pod != "pod-a" {
		t.Fatalf("before ttl: %q %v", pod, ok)
	}
	s.Pin(k, "pod-a", t0.Add(200*time.Second)) // a request of the session renews it
	if _, ok := s.Pinned(k, t0.Add(499*time.Second)); !ok {
		t.Fatal("a renewed pin expired at the first ttl")
	}
	if _, ok := s.Pinned(k, t0.Add(500*time.Second)); ok {
		t.Fatal("pinned ttl after its last use")
	}
	if s.Len() != 0 {
		t.Fatalf("an expired pin is dropped when looked up: %d left", s.Len())
	}
}

func TestExpiredPinsGoWhenAnotherIsWritten(t *testing.T) {
	s := NewStore[string](time.Minute, 100)
	for i := range 50 {
		s.Pin(KeyOf(fmt.Sprint(i)), "p", t0)
	}
	s.Pin(KeyOf("late"), "p", t0.Add(time.Minute))
	if s.Len() != 1 {
		t.Fatalf("%d tracked; the 50 expired pins should be gone", s.Len())
	}
}

func TestTrackedSessionsAreBoundedLeastRecentlyUsedFirst(t *testing.T) {
	const max = 64
	s := NewStore[string](time.Hour, max)
	for i := range max {
		s.Pin(KeyOf(fmt.Sprint(i)), fmt.Sprint("pod-", i%4), t0.Add(time.Duration(i)*time.Millisecond))
	}
	now := t0.Add(time.Second)
	s.Pin(KeyOf("0"), "pod-0", now) // used again: now the most recent
	for i := range 10 * max {
		s.Pin(KeyOf(fmt.Sprint("new-", i)), "pod-1", now)
		if s.Len() > max {
			t.Fatalf("%d sessions tracked, bound %d", s.Len(), max)
		}
		if i == 0 {
			if _, ok := s.Pinned(KeyOf("1"), now); ok {
				t.Fatal("the least recently used session survived an eviction")
			}
			if _, ok := s.Pinned(KeyOf("0"), now); !ok {
				t.Fatal("the most recently used old session was evicted first")
			}
		}
	}
	if s.Len() != max {
		t.Fatalf("%d tracked", s.Len())
	}
}

func TestReleaseOnlyDropsThePinItSaw(t *testing.T) {
	s := NewStore[string](time.Hour, 10)
	k := KeyOf("alice")
	s.Pin(k, "pod-a", t0)
	s.Pin(k, "pod-b", t0) // another request moved it meanwhile
	s.Release(k, "pod-a")
	if pod, ok := s.Pinned(k, t0); !ok || pod != "pod-b" {
		t.Fatalf("%q %v", pod, ok)
	}
	s.Release(k, "pod-b") // its pod left the pool
	if _, ok := s.Pinned(k, t0); ok {
		t.Fatal("released pin still there")
	}
}

func TestKeysDoNotDependOnIDLength(t *testing.T) {
	if KeyOf("a") == KeyOf("b") || KeyOf("") == KeyOf(" ") {
		t.Fatal("distinct ids share a key")
	}
}

func TestConcurrentUse(t *testing.T) {
	s := NewStore[string](time.Second, 100)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				k := KeyOf(fmt.Sprint(i % 300))
				now := t0.Add(time.Duration(i) * time.Millisecond)
				if pod, ok := s.Pinned(k, now); ok {
					s.Release(k, pod)
				}
				s.Pin(k, fmt.Sprint("pod-", g), now)
			}
		}()
	}
	wg.Wait()
	if s.Len() > 100 {
		t.Fatalf("%d tracked, bound 100", s.Len())
	}
}

// The bytes one tracked session costs (picker/README.md quotes it): the heap a full store
// of N sessions holds, over N. Pods are shared strings, as GIE's names are.
func TestBytesPerSession(t *testing.T) {
	const n = 100_000
	pods := []string{"default/pool-0", "default/pool-1", "default/pool-2"}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := NewStore[string](time.Hour, n)
	for i := range n {
		s.Pin(KeyOf(fmt.Sprint(i)), pods[i%3], t0)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per tracked session (string pod)", per)
	if per > 256 {
		t.Errorf("%.0f bytes per session; the README's bound assumes at most 256", per)
	}
	runtime.KeepAlive(s)
}
