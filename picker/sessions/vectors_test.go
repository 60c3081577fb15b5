package sessions

import (
	"encoding/json"
	"slices"
	"testing"

	"promptcache.local/picker/testvectors"
)

type vectorFile struct {
	Contract struct {
		SessionSources []string `json:"session_sources"`
	}
	Sessions struct {
		MaxIDChars       int    `json:"max_id_chars"`
		PythonWhitespace []rune `json:"python_whitespace"`
		Cases            []struct {
			Sources []string `json:"sources"`
			Order   string   `json:"order"`
			Header  *string  `json:"header"`
			Body    string   `json:"body"`
			Session *string  `json:"session"`
		}
	}
}

func loadVectors(t *testing.T) vectorFile {
	t.Helper()
	raw := testvectors.Vectors
	var v vectorFile
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Sessions.Cases) == 0 {
		t.Fatal("no session vectors: run python tools/picker_vectors.py")
	}
	return v
}

// The session a request names is request_session's (promptcache.contract.session), case
// by case: sources in order, a blank header, Python's strip, the code-point limit, control
// characters, values that are not strings.
func TestIDIsRequestSession(t *testing.T) {
	v := loadVectors(t)
	if v.Sessions.MaxIDChars != MaxIDChars {
		t.Fatalf("MaxIDChars %d, Python's %d", MaxIDChars, v.Sessions.MaxIDChars)
	}
	for i, c := range v.Sessions.Cases {
		sources, err := ParseSources(c.Sources)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		var body map[string]any
		if err := json.Unmarshal([]byte(c.Body), &body); err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		header, present := "", c.Header != nil
		if present {
			header = *c.Header
		}
		got, ok := ID(sources, header, present, body)
		switch {
		case c.Session == nil && ok:
			t.Errorf("case %d (%s, header %q, body %.80s): session %q, Python names none", i, c.Order, header, c.Body, got)
		case c.Session != nil && (!ok || got != *c.Session):
			t.Errorf("case %d (%s, header %q, body %.80s): session %q (%v), Python %q", i, c.Order, header, c.Body, got, ok, *c.Session)
		}
	}
}

// IsPySpace agrees with Python's str.isspace on every code point.
func TestIsPySpaceIsPythons(t *testing.T) {
	v := loadVectors(t)
	want := map[rune]bool{}
	for _, r := range v.Sessions.PythonWhitespace {
		want[r] = true
	}
	for r := rune(0); r <= 0x10ffff; r++ {
		if IsPySpace(r) != want[r] {
			t.Errorf("U+%04X: IsPySpace %v, Python %v", r, IsPySpace(r), want[r])
		}
	}
}

// Every source Python names is one ParseSources knows, and no other.
func TestSourcesAreTheContracts(t *testing.T) {
	v := loadVectors(t)
	if _, err := ParseSources(v.Contract.SessionSources); err != nil {
		t.Fatal(err)
	}
	known := []string{string(Header), string(PromptCacheKey), string(User)}
	names := slices.Clone(v.Contract.SessionSources)
	slices.Sort(names)
	slices.Sort(known)
	if !slices.Equal(names, known) {
		t.Errorf("sources %v, Python's %v", known, names)
	}
}
