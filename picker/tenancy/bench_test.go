package tenancy

import (
	"encoding/json"
	"strings"
	"testing"
)

// chatBody is a chat request of about n bytes (one user message).
func chatBody(n int) []byte {
	content := strings.Repeat("lorem ipsum dolor sit amet ", n/27+1)[:n]
	return []byte(`{"model":"m","messages":[{"role":"user","content":"` + content + `"}],"max_tokens":16}`)
}

var benchHeaders = map[string]string{
	":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json",
	"x-prompt-cache-isolation-key": "tenant-a", "x-user": "alice",
}

// BenchmarkDecide is what the tenant-salt parser adds per request (with an account: the
// decision, the salt and the body digest), beside BenchmarkGIEParse, what GIE's own parser
// already spends decoding the same body (a map and a typed struct).
func BenchmarkDecide(b *testing.B) {
	s := Settings{Mode: PerKey, IsolationHeader: "x-prompt-cache-isolation-key",
		IsolationField: "prompt_cache_isolation_key", HonorPromptCacheMaxLen: true, IdentityHeader: "x-user"}
	secret := []byte("bench-salt-key-0123456789abcdef")
	for _, size := range []struct {
		name string
		n    int
	}{{"1KiB", 1 << 10}, {"32KiB", 32 << 10}, {"1MiB", 1 << 20}} {
		body := chatBody(size.n)
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			b.Fatal(err)
		}
		b.Run(size.name+"/decide+digest", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				d := Decide(Request{Headers: benchHeaders, Body: body}, s, secret)
				if d.Refusal != nil {
					b.Fatal(d.Refusal)
				}
				SetSalt(m, d)
				if _, err := BodyDigest(m); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(size.name+"/gie-parse", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				var m map[string]any
				var typed struct {
					Model    string           `json:"model"`
					Messages []map[string]any `json:"messages"`
				}
				if json.Unmarshal(body, &m) != nil || json.Unmarshal(body, &typed) != nil {
					b.Fatal("parse")
				}
			}
		})
	}
}
