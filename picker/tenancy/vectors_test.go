package tenancy

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"promptcache.local/picker/testvectors"
)

// blob is bytes in the vectors: a JSON string (UTF-8) or {"hex": "..."}.
type blob []byte

func (b *blob) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		*b = []byte(s)
		return nil
	}
	var h struct{ Hex string }
	if err := json.Unmarshal(data, &h); err != nil {
		return err
	}
	raw, err := hex.DecodeString(h.Hex)
	*b = raw
	return err
}

type hexBytes []byte

func (h *hexBytes) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	raw, err := hex.DecodeString(s)
	*h = raw
	return err
}

type vectorFile struct {
	Secret               hexBytes `json:"secret"`
	MaxIsolationKeyChars int      `json:"max_isolation_key_chars"`
	MaxIdentityChars     int      `json:"max_identity_chars"`
	MinSaltKeyBytes      int      `json:"min_salt_key_bytes"`
	Salts                []struct{ Key, Salt string }
	AccountSalts         []struct {
		Account hexBytes
		Key     *string
		Salt    string
	} `json:"account_salts"`
	AccountDigests []struct {
		Source, Value string
		Digest        hexBytes
	} `json:"account_digests"`
	Identities []struct {
		Kind, Value string
		Identity    *string
		Code        *string
	}
	SaltKeys []struct {
		Raw    blob
		Secret *hexBytes
	} `json:"salt_keys"`
	BodyDigests []struct {
		Body   blob
		Digest hexBytes
	} `json:"body_digests"`
	Attestation struct {
		Key         hexBytes
		Account     hexBytes
		AccountText string `json:"account_text"`
		Digest      hexBytes
		Now         int64
		Nonce       hexBytes
		Sign        []struct {
			KeyValues []string `json:"key_values"`
			Binding   hexBytes
			Value     string
		}
	}
	Settings  map[string]pluginSettings
	Decisions []struct {
		Name, Settings string
		Headers        [][2]json.RawMessage
		Body           blob
		Code           *string
		Salt           *string
		Account        *string
		Digest         *hexBytes
	}
}

type pluginSettings struct {
	IsolationMode          IsolationMode
	IsolationHeader        string
	IsolationField         string
	HonorPromptCacheMaxLen bool
	AllowClientPriority    bool
	AllowEngineState       bool
	IdentityHeader         string
	IdentityBearer         bool
	IdentityRequired       bool
}

func (p pluginSettings) settings() Settings {
	return Settings{
		Mode: p.IsolationMode, IsolationHeader: p.IsolationHeader, IsolationField: p.IsolationField,
		HonorPromptCacheMaxLen: p.HonorPromptCacheMaxLen, AllowClientPriority: p.AllowClientPriority,
		AllowEngineState: p.AllowEngineState, IdentityHeader: p.IdentityHeader,
		IdentityBearer: p.IdentityBearer, IdentityRequired: p.IdentityRequired,
	}
}

func load(t *testing.T) *vectorFile {
	t.Helper()
	raw := testvectors.Vectors
	var v vectorFile
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return &v
}

func TestLimits(t *testing.T) {
	v := load(t)
	if v.MaxIsolationKeyChars != MaxIsolationKeyChars || v.MaxIdentityChars != MaxIdentityChars || v.MinSaltKeyBytes != MinSaltKeyBytes {
		t.Fatalf("limits differ from Python: %d/%d/%d", v.MaxIsolationKeyChars, v.MaxIdentityChars, v.MinSaltKeyBytes)
	}
}

func TestSalts(t *testing.T) {
	v := load(t)
	for _, c := range v.Salts {
		if got := DeriveSalt(v.Secret, c.Key); got != c.Salt {
			t.Errorf("DeriveSalt(%.20q) = %s, Python %s", c.Key, got, c.Salt)
		}
	}
	for _, c := range v.AccountSalts {
		if got := DeriveAccountSalt(v.Secret, c.Account, c.Key); got != c.Salt {
			t.Errorf("DeriveAccountSalt(key %v) = %s, Python %s", c.Key, got, c.Salt)
		}
	}
	if s := RandomSalt(); !strings.HasPrefix(s, UncacheableSaltPrefix) || len(s) != 5+43 {
		t.Errorf("RandomSalt() = %s", s)
	}
}

func TestAccountDigests(t *testing.T) {
	v := load(t)
	for _, c := range v.AccountDigests {
		if got := AccountDigest(v.Secret, c.Source, c.Value); !bytes.Equal(got, c.Digest) {
			t.Errorf("AccountDigest(%s, %.20q) differs", c.Source, c.Value)
		}
	}
}

func TestIdentities(t *testing.T) {
	v := load(t)
	for _, c := range v.Identities {
		var got string
		var r *Refusal
		if c.Kind == "header" {
			got, r = HeaderIdentity(c.Value, "x-user")
		} else {
			got, r = BearerIdentity(c.Value)
		}
		switch {
		case c.Code != nil:
			if r == nil || r.Code != *c.Code {
				t.Errorf("%s %.30q: Python refuses (%s), Go gives %q %v", c.Kind, c.Value, *c.Code, got, r)
			}
		case r != nil:
			t.Errorf("%s %.30q: Go refuses (%v), Python does not", c.Kind, c.Value, r)
		case c.Identity == nil && got != "", c.Identity != nil && got != *c.Identity:
			t.Errorf("%s %.30q: Go %q, Python %v", c.Kind, c.Value, got, c.Identity)
		}
	}
}

func TestSaltKeys(t *testing.T) {
	v := load(t)
	for _, c := range v.SaltKeys {
		got, err := CleanSaltKey(c.Raw)
		switch {
		case c.Secret == nil && err == nil:
			t.Errorf("CleanSaltKey(%q) accepted a key Python refuses", c.Raw)
		case c.Secret != nil && (err != nil || !bytes.Equal(got, *c.Secret)):
			t.Errorf("CleanSaltKey(%q) = %q, %v; Python %q", c.Raw, got, err, *c.Secret)
		}
	}
}

func TestBodyDigests(t *testing.T) {
	v := load(t)
	for _, c := range v.BodyDigests {
		var body map[string]any // as GIE's parser decodes it
		if err := json.Unmarshal(c.Body, &body); err != nil {
			t.Fatal(err)
		}
		got, err := BodyDigest(body)
		if err != nil || !bytes.Equal(got, c.Digest) {
			var b strings.Builder
			_ = writePyJSON(&b, body)
			t.Errorf("BodyDigest(%s) differs; Go canonical form %s", c.Body, b.String())
		}
	}
}

func TestAttestation(t *testing.T) {
	v := load(t)
	a := v.Attestation
	if got := AttestationKey(v.Secret); !bytes.Equal(got, a.Key) {
		t.Fatal("AttestationKey differs")
	}
	acct := Account{Digest: a.Account}
	if acct.Text() != a.AccountText {
		t.Fatalf("Account.Text %s, Python %s", acct.Text(), a.AccountText)
	}
	for _, c := range a.Sign {
		if got := KeyBinding(c.KeyValues); !bytes.Equal(got, c.Binding) {
			t.Errorf("KeyBinding(%q) differs", c.KeyValues)
		}
		if got := Sign(a.Key, acct, c.KeyValues, a.Digest, a.Now, a.Nonce); got != c.Value {
			t.Errorf("Sign(%q) = %s, Python %s", c.KeyValues, got, c.Value)
		}
	}
}

func TestDecisions(t *testing.T) {
	v := load(t)
	for _, c := range v.Decisions {
		s := v.Settings[c.Settings].settings()
		if err := s.Check(); err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		headers := map[string]string{}
		for _, kv := range c.Headers {
			var name string
			var value blob
			if json.Unmarshal(kv[0], &name) != nil || json.Unmarshal(kv[1], &value) != nil {
				t.Fatalf("%s: bad header vector", c.Name)
			}
			headers[name] = string(value)
		}
		var secret []byte
		if s.NeedsSaltKey() {
			secret = v.Secret
		}
		d := Decide(Request{Headers: headers, Body: c.Body}, s, secret)
		code := ""
		if d.Refusal != nil {
			code = d.Refusal.Code
		}
		want := ""
		if c.Code != nil {
			want = *c.Code
		}
		if code != want {
			t.Errorf("%s: Go refusal %q (%v), Python %q", c.Name, code, d.Refusal, want)
			continue
		}
		if want != "" {
			if !strings.HasPrefix(d.Salt, UncacheableSaltPrefix) {
				t.Errorf("%s: a refused request must attract nothing, got salt %q", c.Name, d.Salt)
			}
			continue
		}
		wantSalt := ""
		if c.Salt != nil {
			wantSalt = *c.Salt
		}
		uncacheable := strings.HasPrefix(wantSalt, UncacheableSaltPrefix)
		if uncacheable != strings.HasPrefix(d.Salt, UncacheableSaltPrefix) || (!uncacheable && d.Salt != wantSalt) {
			t.Errorf("%s: Go salt %q, Python %q", c.Name, d.Salt, wantSalt)
		}
		gotAccount := ""
		if d.Account != nil {
			gotAccount = d.Account.Text()
		}
		if (c.Account == nil) != (d.Account == nil) || (c.Account != nil && *c.Account != gotAccount) {
			t.Errorf("%s: Go account %q, Python %v", c.Name, gotAccount, c.Account)
		}
		if c.Digest != nil {
			var body map[string]any
			if err := json.Unmarshal(c.Body, &body); err != nil {
				t.Fatalf("%s: %v", c.Name, err)
			}
			SetSalt(body, d)
			got, err := BodyDigest(body)
			if err != nil || !bytes.Equal(got, *c.Digest) {
				t.Errorf("%s: the digest of the forwarded body differs from Python's", c.Name)
			}
		}
	}
}

func TestRouteTableClassifies(t *testing.T) {
	for _, r := range routeTable {
		if got := FindRoute(strings.ReplaceAll(r.Path, "{response_id}", "x")); got == nil || got.Path != r.Path {
			t.Errorf("FindRoute(%s) = %v", r.Path, got)
		}
	}
}

func TestDepthIsRefusedBelowPythonsLimit(t *testing.T) {
	deep := func(n int) []byte {
		return []byte(`{"model":"m","x":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`)
	}
	if _, r := ParseBody(deep(MaxDepth-1), nil); r != nil {
		t.Fatalf("depth %d refused: %v", MaxDepth, r)
	}
	if _, r := ParseBody(deep(MaxDepth+1), nil); r == nil || r.Code != CodeJSONTooDeep {
		t.Fatalf("depth %d: %v", MaxDepth+2, r)
	}
}
