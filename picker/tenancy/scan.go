package tenancy

import (
	"bytes"
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth bounds nesting below Python's limit (its recursion limit, about 1000 less the
// stack in use, where the front refuses with json_too_deep), so every body the front
// refuses for depth is refused here too; a body nested 512 to ~990 deep, which the front
// would serve, gets a one-off salt here (it routes by load alone).
const MaxDepth = 512

// Member is one top-level member of a body: its raw JSON value, and whether a string in
// it holds a lone surrogate escape (Go decodes one as U+FFFD, Python keeps it and refuses
// it later: the front never serves such a body).
type Member struct {
	Raw  []byte
	Lone bool
}

// Body is a request body as canonical.py's parse_body reads it: the top-level members by
// name, and whether any string anywhere holds a lone surrogate.
type Body struct {
	Members map[string]Member
	Names   []string // in order
	Lone    bool
}

// goFoldsToASCII is canonical.py's GO_FOLDS_TO_ASCII.
var goFoldsToASCII = map[rune]rune{'\u017f': 'S', '\u212a': 'K'}

// GoFold is canonical.py's go_fold: a name as encoding/json folds it to match a field.
func GoFold(name string) string {
	for i := 0; i < len(name); i++ {
		if c := name[i]; ('a' <= c && c <= 'z') || c >= utf8.RuneSelf {
			return string(appendFold(make([]byte, 0, len(name)), name))
		}
	}
	return name // nothing folds: no copy
}

// appendFold appends GoFold(name) to b.
func appendFold(b []byte, name string) []byte {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= utf8.RuneSelf {
			for _, r := range name[i:] {
				if f, ok := goFoldsToASCII[r]; ok {
					r = f
				} else if 'a' <= r && r <= 'z' {
					r -= 'a' - 'A'
				}
				b = utf8.AppendRune(b, r)
			}
			return b
		}
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		b = append(b, c)
	}
	return b
}

// Fields are the fields a body scan checks the spelling of (canonical.py's acted_on),
// folded once.
type Fields map[string]string

// NewFields folds actedOn ("" entries are skipped).
func NewFields(actedOn []string) Fields {
	known := Fields{}
	for _, f := range actedOn {
		if f != "" {
			known[GoFold(f)] = f
		}
	}
	return known
}

// ParseBody is canonical.py's parse_body: strict UTF-8 without a BOM, valid JSON with
// finite numbers, every object naming each member once, an object at the top, and no
// top-level name folding (Go's way) onto another or onto a field in actedOn it is not.
func ParseBody(raw []byte, actedOn []string) (*Body, *Refusal) {
	return parseBody(raw, NewFields(actedOn))
}

func parseBody(raw []byte, known Fields) (*Body, *Refusal) {
	if bytes.HasPrefix(raw, []byte("\xef\xbb\xbf")) || bytes.HasPrefix(raw, []byte("\xff\xfe")) || bytes.HasPrefix(raw, []byte("\xfe\xff")) {
		return nil, refuse(400, CodeInvalidJSON, "the request body starts with a byte-order mark; send UTF-8 JSON without one")
	}
	if !utf8.Valid(raw) {
		return nil, refuse(400, CodeInvalidJSON, "the request body is not valid UTF-8; send UTF-8 JSON")
	}
	s := &scanner{data: raw}
	s.ws()
	body := &Body{Members: make(map[string]Member, 8), Names: make([]string, 0, 8)}
	if r := s.value(0, body); r != nil {
		return nil, r
	}
	s.ws()
	if s.pos != len(s.data) {
		return nil, refuse(400, CodeInvalidJSON, "the request body is not valid JSON: extra data at byte %d", s.pos)
	}
	if !s.topObject {
		return nil, refuse(400, CodeBodyNotObject, "the request body must be a JSON object")
	}
	body.Lone = s.lone
	if name, ok := foldClash(body.Names, known); !ok {
		return nil, refuse(400, CodeAmbiguousField, "the request body's member %q is another spelling of a field; spell each field once, exactly", name)
	}
	return body, nil
}

// foldClash finds the first name (in order) that folds (Go's way) onto a known field it is
// not, or onto an earlier name; ok when there is none. The folds go into one buffer and a
// few names are compared pairwise: no map and no string per name on a request's path.
func foldClash(names []string, known Fields) (string, bool) {
	var arena [512]byte
	buf := arena[:0]
	var ends [16]int
	if len(names) > len(ends) {
		return foldClashMap(names, known)
	}
	start := 0
	for i, name := range names {
		buf = appendFold(buf, name)
		fold := buf[start:]
		if field, isField := known[string(fold)]; isField && field != name {
			return name, false
		}
		prev := 0
		for j := 0; j < i; j++ {
			if bytes.Equal(buf[prev:ends[j]], fold) {
				return name, false
			}
			prev = ends[j]
		}
		ends[i] = len(buf)
		start = len(buf)
	}
	return "", true
}

func foldClashMap(names []string, known Fields) (string, bool) {
	folded := make(map[string]struct{}, len(names))
	for _, name := range names {
		fold := GoFold(name)
		field, isField := known[fold]
		_, seen := folded[fold]
		if (isField && field != name) || seen {
			return name, false
		}
		folded[fold] = struct{}{}
	}
	return "", true
}

type scanner struct {
	data      []byte
	pos       int
	lone      bool
	topObject bool
}

func (s *scanner) ws() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *scanner) bad(what string) *Refusal {
	return refuse(400, CodeInvalidJSON, "the request body is not valid JSON: %s at byte %d", what, s.pos)
}

// value scans one value; at depth 0 with top set it records the object's members.
func (s *scanner) value(depth int, top *Body) *Refusal {
	if depth > MaxDepth {
		return refuse(400, CodeJSONTooDeep, "the request body nests JSON too deeply")
	}
	if s.pos >= len(s.data) {
		return s.bad("expecting value")
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		if top != nil {
			s.topObject = true
		}
		return s.object(depth, top)
	case c == '[':
		s.pos++
		s.ws()
		if s.pos < len(s.data) && s.data[s.pos] == ']' {
			s.pos++
			return nil
		}
		for {
			s.ws()
			if r := s.value(depth+1, nil); r != nil {
				return r
			}
			s.ws()
			if s.pos >= len(s.data) {
				return s.bad("unterminated array")
			}
			if s.data[s.pos] == ',' {
				s.pos++
				continue
			}
			if s.data[s.pos] == ']' {
				s.pos++
				return nil
			}
			return s.bad("expecting ',' delimiter")
		}
	case c == '"':
		_, r := s.str(false)
		return r
	case c == '-' || ('0' <= c && c <= '9'):
		return s.number()
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(s.data[s.pos:], []byte(lit)) {
				s.pos += len(lit)
				return nil
			}
		}
		return s.bad("expecting value")
	}
}

func (s *scanner) object(depth int, top *Body) *Refusal {
	s.pos++
	s.ws()
	if s.pos < len(s.data) && s.data[s.pos] == '}' {
		s.pos++
		return nil
	}
	var names map[string]struct{}
	dup := ""
	for {
		s.ws()
		if s.pos >= len(s.data) || s.data[s.pos] != '"' {
			return s.bad("expecting property name enclosed in double quotes")
		}
		name, r := s.str(true)
		if r != nil {
			return r
		}
		if names == nil {
			names = map[string]struct{}{}
		}
		if _, ok := names[name]; ok && dup == "" {
			dup = name
		}
		names[name] = struct{}{}
		s.ws()
		if s.pos >= len(s.data) || s.data[s.pos] != ':' {
			return s.bad("expecting ':' delimiter")
		}
		s.pos++
		s.ws()
		start, loneBefore := s.pos, s.lone
		s.lone = false
		if r := s.value(depth+1, nil); r != nil {
			return r
		}
		if top != nil {
			top.Names = append(top.Names, name)
			top.Members[name] = Member{Raw: s.data[start:s.pos], Lone: s.lone}
		}
		s.lone = s.lone || loneBefore
		s.ws()
		if s.pos >= len(s.data) {
			return s.bad("unterminated object")
		}
		if s.data[s.pos] == ',' {
			s.pos++
			continue
		}
		if s.data[s.pos] == '}' {
			s.pos++
			break
		}
		return s.bad("expecting ',' delimiter")
	}
	if dup != "" { // Python's object_pairs_hook refuses when the object closes
		return refuse(400, CodeDuplicateField, "an object in the request body names the member %q more than once; name each member once", dup)
	}
	return nil
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// plainRun is how many bytes at the start of b need nothing done inside a JSON string (no
// '"', no '\\', none below 0x20), eight at a time: a body's text is almost all such bytes.
// A word with a flagged byte is finished one byte at a time (the word test is exact about
// whether a word holds one: a borrow only spreads above a byte that matched).
func plainRun(b []byte) int {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		q, bs := x^(ones*'"'), x^(ones*'\\')
		if ((x-ones*0x20)&^x|(q-ones)&^q|(bs-ones)&^bs)&highs != 0 {
			break
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 {
			break
		}
	}
	return i
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[:4]), 16, 32)
	return rune(v), err == nil
}

// str scans a string, returns it decoded when keep is set (a lone surrogate as U+FFFD,
// noted in s.lone); values are only checked, not copied.
func (s *scanner) str(keep bool) (string, *Refusal) {
	s.pos++ // opening quote
	// The usual string (no escape, no control character) in one pass: a name is one copy.
	if i := s.pos + plainRun(s.data[s.pos:]); i < len(s.data) && s.data[i] == '"' {
		out := ""
		if keep {
			out = string(s.data[s.pos:i])
		}
		s.pos = i + 1
		return out, nil
	}
	var b strings.Builder
	write := func(p []byte) {
		if keep {
			b.Write(p)
		}
	}
	writeByte := func(c byte) {
		if keep {
			b.WriteByte(c)
		}
	}
	writeRune := func(r rune) {
		if keep {
			b.WriteRune(r)
		}
	}
	for {
		if s.pos >= len(s.data) {
			return "", s.bad("unterminated string")
		}
		c := s.data[s.pos]
		switch {
		case c == '"':
			s.pos++
			return b.String(), nil
		case c < 0x20:
			return "", s.bad("invalid control character")
		case c != '\\':
			start := s.pos
			s.pos += plainRun(s.data[s.pos:])
			write(s.data[start:s.pos])
			continue
		}
		if s.pos+1 >= len(s.data) {
			return "", s.bad("unterminated string")
		}
		esc := s.data[s.pos+1]
		s.pos += 2
		switch esc {
		case '"', '\\', '/':
			writeByte(esc)
		case 'b':
			writeByte('\b')
		case 'f':
			writeByte('\f')
		case 'n':
			writeByte('\n')
		case 'r':
			writeByte('\r')
		case 't':
			writeByte('\t')
		case 'u':
			r, ok := hex4(s.data[s.pos:])
			if !ok {
				return "", s.bad("invalid \\uXXXX escape")
			}
			s.pos += 4
			if utf16.IsSurrogate(r) {
				if r < 0xdc00 && s.pos+6 <= len(s.data) && s.data[s.pos] == '\\' && s.data[s.pos+1] == 'u' {
					if r2, ok := hex4(s.data[s.pos+2:]); ok && 0xdc00 <= r2 && r2 <= 0xdfff {
						s.pos += 6
						writeRune(utf16.DecodeRune(r, r2))
						continue
					}
				}
				s.lone = true
				r = utf8.RuneError
			}
			writeRune(r)
		default:
			return "", s.bad("invalid \\escape")
		}
	}
}

func (s *scanner) number() *Refusal {
	start := s.pos
	if s.data[s.pos] == '-' {
		s.pos++
	}
	digits := func() int {
		n := 0
		for s.pos < len(s.data) && '0' <= s.data[s.pos] && s.data[s.pos] <= '9' {
			s.pos++
			n++
		}
		return n
	}
	if s.pos < len(s.data) && s.data[s.pos] == '0' {
		s.pos++
	} else if digits() == 0 {
		return s.bad("expecting value")
	}
	isFloat := false
	if s.pos < len(s.data) && s.data[s.pos] == '.' {
		save := s.pos
		s.pos++
		if digits() == 0 { // Python reads "1." as 1 followed by extra data
			s.pos = save
		} else {
			isFloat = true
		}
	}
	if s.pos < len(s.data) && (s.data[s.pos] == 'e' || s.data[s.pos] == 'E') {
		save := s.pos
		s.pos++
		if s.pos < len(s.data) && (s.data[s.pos] == '+' || s.data[s.pos] == '-') {
			s.pos++
		}
		if digits() == 0 {
			s.pos = save
		} else {
			isFloat = true
		}
	}
	if isFloat {
		f, _ := strconv.ParseFloat(string(s.data[start:s.pos]), 64)
		if math.IsInf(f, 0) {
			return refuse(400, CodeInvalidJSON, "the request body is not valid JSON: the number %.40s is too large for a 64-bit float", s.data[start:s.pos])
		}
	}
	return nil
}
