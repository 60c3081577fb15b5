// Package prediction is the plain-Go half of the predicted-match plugin: the header that
// tells the chosen pod, signed, the prefix match GIE's producer found for it, so the cache
// front can count predicted against delivered cached tokens (issue 39). It imports nothing
// of GIE.
//
// The Python module promptcache.tenancy.prediction is the source of this definition (the
// header's name, form, key derivation and MAC); this is a port held to it by the vectors
// tools/picker_vectors.py writes to ../testvectors/prediction_vectors.json.
package prediction

import (
	"crypto/rand"
	"encoding/base64"
	"strconv"

	"promptcache.local/picker/tenancy"
)

// Header is contract.PREDICTED_MATCH_HEADER: the only source of a prediction the front
// believes.
const Header = "x-promptcache-predicted"

// NonceBytes is attestation.py's NONCE_BYTES (the prediction reuses its nonce form).
const NonceBytes = 12

// MaxFigure is prediction.py's MAX_FIGURE: a larger block count or size is malformed there,
// so it is clamped here before signing.
const MaxFigure = 1 << 24

var (
	keyLabel  = []byte("promptcache/prediction-key/v1")
	macDomain = []byte("promptcache/prediction/v1\x00")
)

// Prediction is GIE's PrefixCacheMatchInfo for the chosen pod: the blocks of the prompt the
// producer hashed, how many of them its index places on that pod, the block size in tokens.
//
// Estimated says whether SeenBlocks and HeldBlocks (package ladder's workload and capacity
// figures, of the same blocks) go with it.
type Prediction struct {
	MatchBlocks, TotalBlocks, BlockTokens int
	Estimated                             bool
	SeenBlocks, HeldBlocks                int
}

// Valid says whether the prediction can be sent: a positive block size, and figures the
// front reads (each block count at most total, none beyond MaxFigure, none negative).
func (p Prediction) Valid() bool {
	within := func(n int) bool { return 0 <= n && n <= p.TotalBlocks }
	ok := p.BlockTokens > 0 && p.BlockTokens <= MaxFigure && p.TotalBlocks <= MaxFigure && within(p.MatchBlocks)
	if p.Estimated {
		ok = ok && within(p.SeenBlocks) && within(p.HeldBlocks)
	}
	return ok
}

func (p Prediction) figures() string {
	out := strconv.Itoa(p.MatchBlocks) + "." + strconv.Itoa(p.TotalBlocks) + "." + strconv.Itoa(p.BlockTokens)
	if p.Estimated {
		out += "." + strconv.Itoa(p.SeenBlocks) + "." + strconv.Itoa(p.HeldBlocks)
	}
	return out
}

// Key is prediction.py's prediction_key: derived from the salt key, never it.
func Key(secret []byte) []byte {
	return tenancy.NewMAC(secret).Sum(keyLabel)
}

// Sign is prediction.py's sign: the header value for p, signed at now (the MAC is over the
// header's text before it); nonce nil draws a fresh one.
func Sign(key []byte, p Prediction, now int64, nonce []byte) string {
	return NewSigner(key).Sign(p, now, nonce)
}

// Signer is Sign under one key, keyed once (tenancy.MAC: keying HMAC per call was about
// half of a signature's cost). Safe for concurrent use.
type Signer struct{ mac *tenancy.MAC }

// NewSigner keys a Signer with the prediction key (Key); the key is copied.
func NewSigner(key []byte) *Signer { return &Signer{mac: tenancy.NewMAC(key)} }

// Sign is Sign under the Signer's key.
func (s *Signer) Sign(p Prediction, now int64, nonce []byte) string {
	if nonce == nil {
		var fresh [NonceBytes]byte
		if _, err := rand.Read(fresh[:]); err != nil {
			panic(err) // crypto/rand never fails on Linux
		}
		nonce = fresh[:]
	}
	enc := base64.RawURLEncoding
	signed := "v1." + strconv.FormatInt(now, 10) + "." + enc.EncodeToString(nonce) + "." + p.figures()
	return signed + "." + enc.EncodeToString(s.mac.Sum(macDomain, []byte(signed)))
}
