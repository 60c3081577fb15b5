package tenantsalt

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"promptcache.local/picker/tenancy"
)

const secret = "  test-salt-key-0123456789abcdef\n" // whitespace around it, as a Secret may hold

func parser(t testing.TB, params string) *Parser {
	t.Helper()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "salt-key")
	if err := os.WriteFile(keyFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	raw := strings.ReplaceAll(params, "KEYFILE", keyFile)
	p, err := Factory("salt", json.RawMessage(raw), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*Parser)
}

func chat(extra string) []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":"<b>hi</b> & 1e16"}],"max_tokens":16` + extra + `}`)
}

func headers(kv ...string) map[string]string {
	h := map[string]string{":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
	for i := 0; i+1 < len(kv); i += 2 {
		h[kv[i]] = kv[i+1]
	}
	return h
}

func TestParametersAreDecodedStrictly(t *testing.T) {
	if _, err := Factory("x", json.RawMessage(`{"isolationMode":"Shared","saltKeyFlie":"/x"}`), nil); err == nil {
		t.Fatal("an unknown parameter must stop the picker at start-up")
	}
	if _, err := Factory("x", json.RawMessage(`{"isolationMode":"PerKey"}`), nil); err == nil {
		t.Fatal("PerKey without a salt key must stop the picker")
	}
	if _, err := Factory("x", json.RawMessage(`{"isolationMode":"Shared","identityHeader":"x-user"}`), nil); err == nil {
		t.Fatal("an account source under Shared must stop the picker (settings.py refuses it)")
	}
	if _, err := Factory("x", nil, nil); err != nil {
		t.Fatalf("no parameters is mode Shared: %v", err)
	}
}

func TestTheSaltIsHashedAndForwardedAndTheClientsNeverPasses(t *testing.T) {
	p := parser(t, `{"isolationMode":"PerKey","saltKeyFile":"KEYFILE"}`)
	h := headers("x-prompt-cache-isolation-key", "tenant-a")
	parsed, err := p.ParseRequest(context.Background(), chat(`,"cache_salt":"pck1-forged"`), h)
	if err != nil {
		t.Fatal(err)
	}
	want := tenancy.DeriveSalt([]byte(strings.TrimSpace(secret)), "tenant-a")
	if got := parsed.CacheSalt(); got != want {
		t.Fatalf("hashed salt %q, want %q", got, want)
	}
	if got := parsed.Payload.(scheduling.PayloadMap)["cache_salt"]; got != want {
		t.Fatalf("forwarded salt %v, want %q", got, want)
	}
	// no key: the unsalted shared scope, and the forged salt is gone from both places
	parsed, err = p.ParseRequest(context.Background(), chat(`,"cache_salt":"pck1-forged"`), headers())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := parsed.Payload.(scheduling.PayloadMap)["cache_salt"]; ok || parsed.CacheSalt() != "" {
		t.Fatalf("a client's salt passed: %q", parsed.CacheSalt())
	}
}

func TestARefusedRequestAttractsNothing(t *testing.T) {
	p := parser(t, `{"isolationMode":"Required","saltKeyFile":"KEYFILE"}`)
	parsed, err := p.ParseRequest(context.Background(), chat(""), headers())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(parsed.CacheSalt(), tenancy.UncacheableSaltPrefix) {
		t.Fatalf("Required without a key: salt %q, want a one-off salt", parsed.CacheSalt())
	}
}

func TestARefusedRequestIsForwardedAsTheClientSentIt(t *testing.T) {
	// GIE re-encodes a map payload: the lone surrogate would come out as U+FFFD, a valid
	// key the front would serve. A refused request keeps its bytes, so the front refuses.
	p := parser(t, `{"isolationMode":"Required","saltKeyFile":"KEYFILE"}`)
	body := chat(`,"prompt_cache_isolation_key":"t\ud800","cache_salt":"mine"`)
	parsed, err := p.ParseRequest(context.Background(), body, headers())
	if err != nil {
		t.Fatal(err)
	}
	raw, ok := parsed.Payload.(scheduling.RawPayload)
	if !ok || !bytes.Equal(raw, body) {
		t.Fatalf("forwarded %T %q, want the client's bytes %q", parsed.Payload, parsed.Payload, body)
	}
	if !strings.HasPrefix(parsed.CacheSalt(), tenancy.UncacheableSaltPrefix) {
		t.Fatalf("hashed salt %q, want a one-off salt", parsed.CacheSalt())
	}
}

func TestTheAccountIsSignedOverTheBodyAsForwarded(t *testing.T) {
	p := parser(t, `{"isolationMode":"PerKey","saltKeyFile":"KEYFILE","identityHeader":"X-User"}`)
	h := headers("x-user", " alice ", "x-prompt-cache-isolation-key", "k", tenancy.IdentityHeader, "v1.forged")
	parsed, err := p.ParseRequest(context.Background(), chat(""), h)
	if err != nil {
		t.Fatal(err)
	}
	key := []byte(strings.TrimSpace(secret))
	account := tenancy.Account{Digest: tenancy.AccountDigest(key, "header", "alice")}
	k := "k"
	if got := parsed.CacheSalt(); got != tenancy.DeriveAccountSalt(key, account.Digest, &k) {
		t.Fatalf("account salt %q", got)
	}
	// what the cache front digests: GIE's json.Marshal of the map, read back
	encoded, err := json.Marshal(parsed.Payload)
	if err != nil {
		t.Fatal(err)
	}
	var received map[string]any
	if err := json.Unmarshal(encoded, &received); err != nil {
		t.Fatal(err)
	}
	digest, err := tenancy.BodyDigest(received)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(h[tenancy.IdentityHeader], ".")
	if len(parts) != 5 || parts[3] != account.Text() {
		t.Fatalf("identity header %q", h[tenancy.IdentityHeader])
	}
	ts, _ := strconv.ParseInt(parts[1], 10, 64)
	nonce, _ := base64.RawURLEncoding.DecodeString(parts[2])
	want := tenancy.Sign(tenancy.AttestationKey(key), account, []string{"k"}, digest, ts, nonce)
	if h[tenancy.IdentityHeader] != want {
		t.Fatalf("the signature does not cover the body the front receives:\n%s\n%s", h[tenancy.IdentityHeader], want)
	}
	// no account: a client's attestation header is blanked, never passed on
	h = headers(tenancy.IdentityHeader, "v1.1.x.y.z")
	if _, err := p.ParseRequest(context.Background(), chat(""), h); err != nil {
		t.Fatal(err)
	}
	if h[tenancy.IdentityHeader] != "" {
		t.Fatalf("a client's identity header passed: %q", h[tenancy.IdentityHeader])
	}
}
