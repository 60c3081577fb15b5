package tenancy

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// IdentityHeader is contract.IDENTITY_ATTESTATION_HEADER: the signed account the cache
// front believes (attestation.py).
const IdentityHeader = "x-promptcache-identity"

// NonceBytes is attestation.py's NONCE_BYTES.
const NonceBytes = 12

var (
	attestationKeyLabel = []byte("promptcache/attestation-key/v1")
	attestationDomain   = []byte("promptcache/attestation/v1\x00")
)

// AttestationKey is attestation.py's attestation_key: derived from the salt key, never it.
func AttestationKey(secret []byte) []byte { return hmacSHA256(secret, attestationKeyLabel) }

// KeyBinding is attestation.py's key_binding: the isolation-key header values as a set,
// sorted, each with its length in code points before it.
func KeyBinding(values []string) []byte {
	set := map[string]struct{}{}
	for _, v := range values {
		set[v] = struct{}{}
	}
	sorted := make([]string, 0, len(set))
	for v := range set {
		sorted = append(sorted, v)
	}
	sort.Strings(sorted) // byte order of valid UTF-8 is code point order, as Python sorts
	var b strings.Builder
	for _, v := range sorted {
		b.WriteString(strconv.Itoa(utf8.RuneCountInString(v)))
		b.WriteByte(':')
		b.WriteString(v)
	}
	sum := sha256.Sum256([]byte(b.String()))
	return sum[:]
}

// Sign is attestation.py's sign: the header value vouching for account on this request.
// nonce nil draws a fresh one.
func Sign(key []byte, account Account, keyValues []string, digest []byte, now int64, nonce []byte) string {
	return SignWith(NewMAC(key), account, keyValues, digest, now, nonce)
}

// SignWith is Sign with the attestation key keyed once (NewMAC(AttestationKey(secret))).
func SignWith(key *MAC, account Account, keyValues []string, digest []byte, now int64, nonce []byte) string {
	if nonce == nil {
		nonce = make([]byte, NonceBytes)
		if _, err := rand.Read(nonce); err != nil {
			panic(err)
		}
	}
	ts := strconv.FormatInt(now, 10)
	mac := key.Sum(attestationDomain, []byte(ts), []byte{0}, nonce, account.Digest, KeyBinding(keyValues), digest)
	enc := base64.RawURLEncoding
	return fmt.Sprintf("v1.%s.%s.%s.%s", ts, enc.EncodeToString(nonce), account.Text(), enc.EncodeToString(mac))
}

// BodyDigest is attestation.py's body_digest over a body as Go's encoding/json decodes it
// into a map (numbers float64): `model` left out, then Python's canonical encoding
// (sorted keys, compact, non-ASCII kept, floats as Python's repr), SHA-256.
func BodyDigest(body map[string]any) ([]byte, error) {
	kept := make(map[string]any, len(body))
	for k, v := range body {
		if k != "model" {
			kept[k] = v
		}
	}
	h := sha256.New()
	w := bufio.NewWriterSize(h, 32<<10)
	if err := writePyJSON(w, kept); err != nil {
		return nil, err
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}
