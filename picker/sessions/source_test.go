package sessions

import (
	"strings"
	"testing"
)

func TestParseSourcesRefusesWhatItDoesNotKnow(t *testing.T) {
	for _, bad := range [][]string{nil, {}, {"cookie"}, {"header", "header"}, {"User"}} {
		if _, err := ParseSources(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	got, err := ParseSources([]string{"user", "header"})
	if err != nil || len(got) != 2 || got[0] != User || got[1] != Header {
		t.Fatalf("%v %v", got, err)
	}
}

func TestIDWithoutBody(t *testing.T) {
	all := []Source{Header, PromptCacheKey, User}
	if id, ok := ID(all, "", false, nil); ok {
		t.Fatalf("no header, no body: %q", id)
	}
	if id, ok := ID(all, "s1", true, nil); !ok || id != "s1" {
		t.Fatalf("%q %v", id, ok)
	}
	long := strings.Repeat("h", 10000) // a header may carry what a body field may not
	if id, ok := ID(all, long, true, nil); !ok || id != long {
		t.Fatal("a long header names its session")
	}
}
