package tenancy

import "fmt"

// Refusal is a request the cache front refuses (tenancy.errors.FrontError): the picker
// does not answer it (the front does, after the pick), but it must not let it attract,
// or add to, any tenant's prefixes.
type Refusal struct {
	Status int
	Code   string // tenancy/errors.py's code, e.g. "invalid_isolation_key"
	Detail string
}

func (r *Refusal) Error() string { return fmt.Sprintf("%d %s: %s", r.Status, r.Code, r.Detail) }

func refuse(status int, code, format string, args ...any) *Refusal {
	return &Refusal{Status: status, Code: code, Detail: fmt.Sprintf(format, args...)}
}

// Codes of tenancy/errors.py the port produces.
const (
	CodeInvalidJSON              = "invalid_json"
	CodeBodyNotObject            = "body_not_object"
	CodeDuplicateField           = "duplicate_field"
	CodeAmbiguousField           = "ambiguous_field"
	CodeJSONTooDeep              = "json_too_deep"
	CodeInvalidUnicode           = "invalid_unicode"
	CodeInvalidField             = "invalid_field"
	CodeInvalidIsolationKey      = "invalid_isolation_key"
	CodeIsolationKeyRequired     = "isolation_key_required"
	CodeInvalidMaxLen            = "invalid_prompt_cache_max_len"
	CodeMaxLenNotSupported       = "prompt_cache_max_len_not_supported"
	CodeRouteNotIsolated         = "route_not_isolated"
	CodePriorityNotAllowed       = "priority_not_allowed"
	CodeFieldNotAllowed          = "field_not_allowed"
	CodeIdentityRequired         = "identity_required"
	CodeInvalidIdentity          = "invalid_identity"
	CodeInvalidRequestTarget     = "invalid_request_target"
	CodeRouteNotFound            = "route_not_found"
	CodePathForbidden            = "path_forbidden"
	CodeMethodNotAllowed         = "method_not_allowed"
	CodeUnsupportedMediaType     = "unsupported_media_type"
	CodeUnsupportedContentEncode = "unsupported_content_encoding"
	CodeInvalidHeader            = "invalid_header"
	CodeBodyNotAllowed           = "body_not_allowed"
)
