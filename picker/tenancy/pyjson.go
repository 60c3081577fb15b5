package tenancy

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// writePyJSON writes v as Python's json.dumps(v, sort_keys=True, ensure_ascii=False,
// separators=(",", ":")) writes it once every number is a float (attestation.py's
// body_digest): the one encoding both sides hash. Go's json.Marshal differs in each of
// its points (it escapes <, >, & and U+2028, writes 1.0 as 1 and 1e16 as 10000000000000000).
func writePyJSON(b pyWriter, v any) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case float64:
		b.WriteString(PyFloatRepr(x))
	case string:
		writePyString(b, x)
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writePyJSON(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writePyString(b, k)
			b.WriteByte(':')
			if err := writePyJSON(b, x[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("body digest: unexpected %T", v)
	}
	return nil
}

const hexDigits = "0123456789abcdef"

// pyWriter is where the canonical form goes: a strings.Builder, or a bufio.Writer in front
// of the digest (a large body is hashed as it is written, never held whole).
type pyWriter interface {
	WriteString(s string) (int, error)
	WriteByte(c byte) error
}

func writePyString(b pyWriter, s string) {
	b.WriteByte('"')
	start := 0 // bytes needing no escape are copied in runs (valid UTF-8: escapes are ASCII)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b.WriteString(s[start:i])
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			b.WriteString(`\u00`)
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&0xf])
		}
		start = i + 1
	}
	b.WriteString(s[start:])
	b.WriteByte('"')
}

// PyFloatRepr is Python's repr of a float (after attestation.py's `or 0.0`, so -0.0 is
// 0.0): the shortest digits that read back, in positional form when the decimal exponent
// is in [-4, 16), else as d.ddde+XX with at least two exponent digits.
func PyFloatRepr(f float64) string {
	switch {
	case f == 0:
		return "0.0"
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	sign := ""
	if f < 0 {
		sign, f = "-", -f
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, exp, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	decpt := x + 1 // Python's dtoa decpt: value = 0.digits * 10**decpt
	if decpt > -4 && decpt <= 16 {
		switch {
		case decpt <= 0:
			return sign + "0." + strings.Repeat("0", -decpt) + digits
		case decpt >= len(digits):
			return sign + digits + strings.Repeat("0", decpt-len(digits)) + ".0"
		default:
			return sign + digits[:decpt] + "." + digits[decpt:]
		}
	}
	m := digits[:1]
	if len(digits) > 1 {
		m += "." + digits[1:]
	}
	es := "+"
	if x < 0 {
		es, x = "-", -x
	}
	return fmt.Sprintf("%s%se%s%02d", sign, m, es, x)
}
