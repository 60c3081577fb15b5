package tenancy

import (
	"encoding/base64"
	"regexp"
	"strings"
	"unicode/utf8"
)

// MaxIdentityChars is identity.py's MAX_IDENTITY_CHARS, counted in code points as Python
// counts len(str).
const MaxIdentityChars = 1024

const (
	headerSource = "header"
	bearerSource = "bearer"
	ows          = " \t"
)

var (
	accountDomain = []byte("promptcache/account/v1\x00")
	bearerToken   = regexp.MustCompile(`^[A-Za-z0-9\-._~+/]+=*$`)
	schemeSplit   = regexp.MustCompile(`[ \t]+`)
)

// Account is identity.py's Account: the keyed digest of where the caller came from.
type Account struct{ Digest []byte }

// Text is Account.text: the digest in URL-safe base64 without padding.
func (a Account) Text() string { return base64.RawURLEncoding.EncodeToString(a.Digest) }

// AccountDigest is identity.py's account_digest.
func AccountDigest(secret []byte, source, value string) []byte {
	return accountDigest(NewMAC(secret), source, value)
}

func accountDigest(mac *MAC, source, value string) []byte {
	return mac.Sum(accountDomain, []byte(source), []byte{0}, []byte(value))
}

func hasControl(s string) bool {
	for _, c := range s {
		if c < 0x20 || c == 0x7f {
			return true
		}
	}
	return false
}

func checkedIdentity(value, name string) (string, *Refusal) {
	if n := utf8.RuneCountInString(value); n > MaxIdentityChars {
		return "", refuse(400, CodeInvalidIdentity, "the %s value has %d characters; at most %d are allowed", name, n, MaxIdentityChars)
	}
	if hasControl(value) {
		return "", refuse(400, CodeInvalidIdentity, "the %s value holds control characters; an account name cannot", name)
	}
	return value, nil
}

// HeaderIdentity is identity.py's header_identity over the one value the picker sees;
// "" means no identity.
func HeaderIdentity(raw, name string) (string, *Refusal) {
	value := strings.Trim(raw, ows)
	if value == "" {
		return "", nil
	}
	return checkedIdentity(value, name)
}

// BearerIdentity is identity.py's bearer_identity: the token, "" when the request has
// none (or another scheme).
func BearerIdentity(raw string) (string, *Refusal) {
	value := strings.Trim(raw, ows)
	if value == "" {
		return "", nil
	}
	parts := schemeSplit.Split(value, 2)
	if !isASCIIFold(parts[0], "bearer") {
		return "", nil
	}
	token := ""
	if len(parts) > 1 {
		token = strings.Trim(parts[1], ows)
	}
	if !bearerToken.MatchString(token) {
		return "", refuse(400, CodeInvalidIdentity, "the bearer token is empty or holds characters a token cannot (whitespace, quotes, ...); send Authorization: Bearer <token> with the token as issued")
	}
	return checkedIdentity(token, "Authorization")
}

func isASCIIFold(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// AccountAtGateway is identity.py's account_at_gateway: the identity header first, then
// the bearer token; nil when the request names no account. headers: lower-case names.
func AccountAtGateway(headers map[string]string, s Settings, secret []byte) (*Account, *Refusal) {
	return accountAtGateway(headers, s, NewMAC(secret))
}

func accountAtGateway(headers map[string]string, s Settings, mac *MAC) (*Account, *Refusal) {
	if !s.ByAccount() {
		return nil, nil
	}
	if s.IdentityHeader != "" {
		value, r := HeaderIdentity(headers[strings.ToLower(s.IdentityHeader)], s.IdentityHeader)
		if r != nil {
			return nil, r
		}
		if value != "" {
			return &Account{accountDigest(mac, headerSource, value)}, nil
		}
	}
	if s.IdentityBearer {
		token, r := BearerIdentity(headers["authorization"])
		if r != nil {
			return nil, r
		}
		if token != "" {
			return &Account{accountDigest(mac, bearerSource, token)}, nil
		}
	}
	return nil, nil
}
