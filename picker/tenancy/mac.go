package tenancy

import (
	"crypto/hmac"
	"crypto/sha256"
	"hash"
	"sync"
)

// MAC is HMAC-SHA256 under one key, keyed once: hmac.New hashes the padded key into fresh
// inner and outer states (two SHA-256 blocks, five allocations) on every call, which per
// request was most of the cost of a salt or a signature. A MAC keeps keyed hashes in a
// pool and Resets them (crypto/hmac then restores its saved keyed states). Safe for
// concurrent use.
type MAC struct{ pool sync.Pool }

// NewMAC keys a MAC (the key is copied).
func NewMAC(key []byte) *MAC {
	key = append([]byte(nil), key...)
	m := &MAC{}
	m.pool.New = func() any { return hmac.New(sha256.New, key) }
	return m
}

// Sum is HMAC-SHA256(key, parts joined).
func (m *MAC) Sum(parts ...[]byte) []byte {
	h := m.pool.Get().(hash.Hash)
	h.Reset()
	for _, p := range parts {
		h.Write(p)
	}
	out := h.Sum(nil)
	m.pool.Put(h)
	return out
}
