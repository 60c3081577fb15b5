package sessions

import (
	"crypto/sha256"
	"sync"
	"time"
)

// Key is what the store keeps of a session id: the first 16 bytes of its SHA-256, so an
// entry costs the same however long the id a client sent (a header may carry kilobytes).
type Key [16]byte

// KeyOf is the store's key for a session id.
func KeyOf(id string) Key {
	sum := sha256.Sum256([]byte(id))
	var k Key
	copy(k[:], sum[:len(k)])
	return k
}

// Store pins sessions to pods. A pin lives ttl after its last Pin (each request of the
// session renews it); at most max sessions are tracked, the least recently pinned
// forgotten first. Every pin has the same ttl, so the least recently pinned is also the
// first to expire: expired pins are dropped from that end whenever a pin is written, and
// any that remain are refused when looked up. Safe for concurrent use. P identifies a pod
// (GIE's namespaced name in the plugin, a string in the tests).
type Store[P comparable] struct {
	mu      sync.Mutex
	ttl     time.Duration
	max     int
	entries map[Key]*entry[P]
	// a ring through a sentinel: head.next is the most recently pinned, head.prev the least
	head entry[P]
}

type entry[P comparable] struct {
	key        Key
	pod        P
	expires    time.Time
	prev, next *entry[P]
}

// NewStore is an empty store; ttl and max must be positive.
func NewStore[P comparable](ttl time.Duration, max int) *Store[P] {
	s := &Store[P]{ttl: ttl, max: max, entries: make(map[Key]*entry[P])}
	s.head.prev, s.head.next = &s.head, &s.head
	return s
}

// Pinned is the pod the session is pinned to, unless there is none or it has expired (an
// expired pin is dropped).
func (s *Store[P]) Pinned(k Key, now time.Time) (P, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var zero P
	e, ok := s.entries[k]
	if !ok {
		return zero, false
	}
	if !now.Before(e.expires) {
		s.remove(e)
		return zero, false
	}
	return e.pod, true
}

// Pin pins the session to pod until now+ttl (renewing or moving an existing pin), then
// drops expired pins and, beyond max, the least recently pinned.
func (s *Store[P]) Pin(k Key, pod P, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[k]
	if ok {
		s.unlink(e)
	} else {
		e = &entry[P]{key: k}
		s.entries[k] = e
	}
	e.pod, e.expires = pod, now.Add(s.ttl)
	s.pushFront(e)
	for last := s.head.prev; last != &s.head && (len(s.entries) > s.max || !now.Before(last.expires)); last = s.head.prev {
		s.remove(last)
	}
}

// Release drops the session's pin if it still names pod (a pin another request moved in
// the meantime stays).
func (s *Store[P]) Release(k Key, pod P) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.entries[k]; ok && e.pod == pod {
		s.remove(e)
	}
}

// Len is the number of sessions tracked (expired pins not yet dropped included).
func (s *Store[P]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

func (s *Store[P]) remove(e *entry[P]) {
	s.unlink(e)
	delete(s.entries, e.key)
}

func (s *Store[P]) unlink(e *entry[P]) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

func (s *Store[P]) pushFront(e *entry[P]) {
	e.prev, e.next = &s.head, s.head.next
	s.head.next.prev = e
	s.head.next = e
}
