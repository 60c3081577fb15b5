// Package testvectors holds the vectors tools/picker_vectors.py writes from the Python
// definitions, for the Go tests that hold the picker to them.
//
// They are embedded rather than read from disk so that `go test` keys a cached result by
// the vectors' content: a file a test opens is keyed by its modification time, which every
// fresh clone changes, so CI re-ran every vector test on a clone whose vectors were the
// same. Only tests import this package; the picker binary does not carry it.
package testvectors

import _ "embed"

// Vectors: tenancy, sessions, the body bounds and the plugins' contracts (vectors.json).
//
//go:embed vectors.json
var Vectors []byte

// Prediction: the signed predicted-match header and its plugin's contract
// (prediction_vectors.json).
//
//go:embed prediction_vectors.json
var Prediction []byte
