package tenancy

import (
	"math/rand"
	"testing"
)

// plainRun finds the first '"', '\\' or control byte wherever it sits in a word, and
// passes every other byte (multi-byte UTF-8 included).
func TestPlainRunStopsAtTheFirstByteThatMatters(t *testing.T) {
	slow := func(b []byte) int {
		for i, c := range b {
			if c == '"' || c == '\\' || c < 0x20 {
				return i
			}
		}
		return len(b)
	}
	rng := rand.New(rand.NewSource(42))
	alphabet := []byte("ab \x00\x1f\x20\"\\\x7f\x80\xc3\xa9\xff!#[]")
	for n := 0; n < 40; n++ {
		for trial := 0; trial < 400; trial++ {
			b := make([]byte, n)
			for i := range b {
				if rng.Intn(6) == 0 {
					b[i] = alphabet[rng.Intn(len(alphabet))]
				} else {
					b[i] = byte(0x20 + rng.Intn(0xe0))
				}
			}
			if got, want := plainRun(b), slow(b); got != want {
				t.Fatalf("plainRun(%q) = %d, want %d", b, got, want)
			}
		}
	}
}
