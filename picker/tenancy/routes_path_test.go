package tenancy

import (
	"regexp"
	"testing"
)

// The hand-written path check is the regexp it replaced (routes.py's pattern), on paths
// that probe each of its rules.
func TestPlainPathIsThePattern(t *testing.T) {
	pattern := regexp.MustCompile(`^(?:/|(?:/[A-Za-z0-9_~.-]+)+)$`)
	paths := []string{"", "/", "//", "/a", "/a/", "a", "a/b", "/a//b", "/v1/chat/completions",
		"/v1/models/x.y-z_~", "/ä", "/a b", "/a\n", "/a/\n", "/a%20", "/.", "/..", "/a/./b",
		"/A-Z/0-9", "///", "/a/b/c/d/e/f", "/a+b", "/a:b", "/\x00", "/a/b/"}
	for c := 0; c < 256; c++ { // every byte in a segment
		paths = append(paths, "/x"+string(rune(c)), "/"+string([]byte{byte(c)}))
	}
	for _, p := range paths {
		if got, want := plainPath(p), pattern.MatchString(p); got != want {
			t.Errorf("plainPath(%q) = %v, the pattern says %v", p, got, want)
		}
	}
}

func TestDotSegment(t *testing.T) {
	for p, want := range map[string]bool{"/": false, "/.": true, "/..": true, "/a/./b": true, "/a/../b": true,
		"/a/.b": false, "/...": false, "/a/b..": false, "/v1/chat/completions": false} {
		if got := dotSegment(p); got != want {
			t.Errorf("dotSegment(%q) = %v, want %v", p, got, want)
		}
	}
}
