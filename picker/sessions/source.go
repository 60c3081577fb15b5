package sessions

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Source is where a request may name its session (contract.session.SessionSource).
type Source string

const (
	// Header is the session header, taken as sent when present and not blank.
	Header Source = "header"
	// PromptCacheKey is OpenAI's cache-routing hint in the body.
	PromptCacheKey Source = "prompt_cache_key"
	// User is the body's `user`.
	User Source = "user"
)

// MaxIDChars bounds a session named in the body, in code points after trimming (what
// Python's len counts); a header has to carry a longer one.
const MaxIDChars = 256

// ParseSources checks the configured sources: known, none twice, at least one.
func ParseSources(names []string) ([]Source, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("sources: at least one of %q, %q, %q", Header, PromptCacheKey, User)
	}
	out := make([]Source, 0, len(names))
	for _, n := range names {
		s := Source(n)
		switch s {
		case Header, PromptCacheKey, User:
		default:
			return nil, fmt.Errorf("sources: unknown source %q (known: %q, %q, %q)", n, Header, PromptCacheKey, User)
		}
		for _, seen := range out {
			if seen == s {
				return nil, fmt.Errorf("sources: %q named twice", n)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// ID is the session a request names: the first of sources that names one. header is the
// session header's value and present whether it was sent; body is the decoded JSON body
// (nil when there is none). The port of request_session: a header counts when not blank
// and is taken as sent; a body field only as Usable accepts it.
func ID(sources []Source, header string, present bool, body map[string]any) (string, bool) {
	for _, s := range sources {
		if s == Header {
			if present && pyStrip(header) != "" {
				return header, true
			}
			continue
		}
		if body == nil {
			continue
		}
		if v, ok := Usable(body[string(s)]); ok {
			return v, true
		}
	}
	return "", false
}

// Usable is a body field's session, if it can name one: a string of 1 to MaxIDChars code
// points after trimming Python's whitespace, with no control character (below U+0020, or
// U+007F). Anything else names no session.
func Usable(v any) (string, bool) {
	s, ok := v.(string)
	if !ok {
		return "", false
	}
	s = pyStrip(s)
	if s == "" || utf8.RuneCountInString(s) > MaxIDChars {
		return "", false
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return "", false
	}
	return s, true
}

// pyStrip is Python's str.strip() with no argument.
func pyStrip(s string) string { return strings.TrimFunc(s, IsPySpace) }

// IsPySpace is Python's str.isspace for one code point: Go's unicode.IsSpace plus the
// information separators U+001C..U+001F, which Python counts as whitespace and Go does not.
func IsPySpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0, 0x1680,
		0x2028, 0x2029, 0x202f, 0x205f, 0x3000:
		return true
	}
	return 0x2000 <= r && r <= 0x200a
}
