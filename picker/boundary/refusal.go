package boundary

import (
	"encoding/json"
	"fmt"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// Refusal is an answer the picker sends the client itself: the cache front's error
// (tenancy/errors.py FrontError), status, code and message, in its JSON shape.
type Refusal struct {
	Status  int
	Code    string
	Message string
}

// Codes and error types of tenancy/errors.py (the vectors hold these to it).
const (
	CodeRequestTooLarge = "request_too_large"
	CodeBodyTimeout     = "body_timeout"
)

var errorTypes = map[int]string{413: "invalid_request_error", 408: "timeout_error"}

// TooLarge is the front's 413 for a body of at least size bytes (runtime.refusals.too_large).
func TooLarge(size, limit int64) Refusal {
	return Refusal{413, CodeRequestTooLarge, fmt.Sprintf(
		"the request body has at least %d bytes; this server accepts at most %d. "+
			"Send prompt embeddings the server has seen by identifier instead of inline",
		size, limit)}
}

// BodyTimeout is the front's 408 for a body slower than the deadline
// (runtime.refusals.body_timeout; the seconds as Python's `:g` writes them).
func BodyTimeout(seconds float64) Refusal {
	return Refusal{408, CodeBodyTimeout, fmt.Sprintf(
		"the request body did not arrive within %s seconds", pyG(seconds))}
}

// pyG formats like Python's format(x, "g"): six significant digits, no trailing zeros.
func pyG(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }

// Body is the response body, byte for byte what Python's json.dumps(FrontError.body())
// writes: {"error": {"message": ..., "type": ..., "code": ..., "param": null}}.
func (r Refusal) Body() []byte {
	return fmt.Appendf(nil, `{"error": {"message": %s, "type": %s, "code": %s, "param": null}}`,
		pyString(r.Message), pyString(errorTypes[r.Status]), pyString(r.Code))
}

// pyString is a JSON string as Python's json.dumps (ensure_ascii) writes it; the messages
// here are ASCII, and json.Marshal's only differences (<, >, & escaped) do not occur in them.
func pyString(s string) string {
	b, _ := json.Marshal(s) // a string always encodes
	return string(b)
}

// Response is the ext_proc answer that sends the refusal to the client directly, as the
// policy step's `immediate` builds it.
func (r Refusal) Response() *extProcPb.ProcessingResponse {
	return &extProcPb.ProcessingResponse{
		Response: &extProcPb.ProcessingResponse_ImmediateResponse{
			ImmediateResponse: &extProcPb.ImmediateResponse{
				Status: &typev3.HttpStatus{Code: typev3.StatusCode(r.Status)},
				Headers: &extProcPb.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
					Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")},
				}}},
				Body:    r.Body(),
				Details: r.Code,
			},
		},
	}
}
