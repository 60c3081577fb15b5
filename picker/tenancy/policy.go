package tenancy

import (
	"encoding/json"
	"regexp"
	"strings"
	"unicode/utf8"
)

// MaxIsolationKeyChars is policy.py's MAX_ISOLATION_KEY_CHARS, counted in code points as
// Python's len(str) counts (a key of 4096 'é' passes on both sides, 4097 fails on both).
const MaxIsolationKeyChars = 4096

// Body fields of contract.names and contract.front.
const (
	CacheSaltField      = "cache_salt"
	PromptCacheMaxLen   = "prompt_cache_max_len"
	PromptCacheKeyField = "prompt_cache_key"
	UserField           = "user"
	PriorityField       = "priority"
	RequestIDField      = "request_id"
)

// EngineStateFields is contract.front's VLLM_ENGINE_STATE_FIELDS, in its order.
var EngineStateFields = []string{"previous_response_id", "kv_transfer_params", "vllm_xargs", "session_id"}

// PolicyFields is canonical.py's POLICY_FIELDS.
var PolicyFields = append([]string{
	CacheSaltField, PromptCacheKeyField, PromptCacheMaxLen, UserField, PriorityField, RequestIDField,
	"stream", "stream_options", "model", "messages", "prompt", "input", "items", "prompt_embeds",
}, EngineStateFields...)

// Isolation is policy.py's Isolation: what isolates one request (a metric label).
type Isolation string

const (
	IsolationShared      Isolation = "shared"
	IsolationKeyed       Isolation = "keyed"
	IsolationAccount     Isolation = "account"
	IsolationUnkeyed     Isolation = "unkeyed"
	IsolationUncacheable Isolation = "uncacheable"
	IsolationRejected    Isolation = "rejected"
)

// Request is what the picker's parser sees of one request.
type Request struct {
	Headers map[string]string // lower-case names, one value each (GIE keeps the last)
	Body    []byte
}

// Decision is what the gateway's policy step decides for one request (gateway/decision.py's
// decide), without the body it forwards: the picker rewrites GIE's decoded body itself.
type Decision struct {
	Isolation Isolation
	// Salt is the cache_salt the picker hashes and forwards; "" means none. A refused
	// request gets a one-off salt here, so it neither attracts nor adds to any scope.
	Salt string
	// Salted: the route is a salted one (the body's cache_salt is the policy's alone).
	Salted  bool
	Account *Account
	Refusal *Refusal
	// Key is the isolation key, when one was sent.
	Key *string
}

// Decide runs the gateway's policy on one request: the front's checks in the front's
// order (route, headers, body, account, apply_policy), and the salt the front derives.
// A picker decides with a Policy built once; this is the same for one request.
func Decide(req Request, s Settings, secret []byte) Decision {
	return NewPolicy(s, secret).Decide(req)
}

// Policy is the settings and the salt key with what they imply computed once, not per
// request: the salt key's HMAC state and the fields whose spelling the body scan checks,
// already folded. Safe for concurrent use.
type Policy struct {
	s      Settings
	mac    *MAC
	fields Fields
	header string // the isolation-key header, lower-cased as GIE's header map is
}

// NewPolicy prepares Decide for settings s and salt key secret (nil in mode Shared).
func NewPolicy(s Settings, secret []byte) *Policy {
	return &Policy{
		s: s, mac: NewMAC(secret),
		fields: NewFields(append(append([]string(nil), PolicyFields...), s.IsolationField)),
		header: strings.ToLower(s.IsolationHeader),
	}
}

// Decide is Decide under this policy.
func (p *Policy) Decide(req Request) Decision {
	d, r := p.decide(req)
	if r != nil {
		return Decision{Isolation: IsolationRejected, Salt: RandomSalt(), Salted: d.Salted, Refusal: r}
	}
	return d
}

func (p *Policy) decide(req Request) (Decision, *Refusal) {
	s := p.s
	h := req.Headers
	method := h[":method"]
	if method == "" {
		method = "POST"
	}
	path, r := CanonicalPath(h[":path"])
	if r != nil {
		return Decision{}, r
	}
	route, r := CheckRoute(method, path)
	if r != nil {
		return Decision{}, r
	}
	if route.Kind == Front {
		return Decision{Isolation: IsolationShared}, nil // the front answers it
	}
	if r := checkHeaders(h); r != nil {
		return Decision{}, r
	}
	if route.Kind != Salted {
		if len(req.Body) > 0 {
			return Decision{}, refuse(400, CodeBodyNotAllowed, "%s takes no request body", route.Path)
		}
		return Decision{Isolation: IsolationShared}, nil
	}
	d := Decision{Salted: true}
	media, _, _ := strings.Cut(h["content-type"], ";")
	if strings.ToLower(strings.TrimSpace(media)) != "application/json" {
		return d, refuse(415, CodeUnsupportedMediaType, "this endpoint takes a JSON body: send Content-Type: application/json")
	}
	body, r := parseBody(req.Body, p.fields)
	if r != nil {
		return d, r
	}
	account, r := accountAtGateway(h, s, p.mac)
	if r != nil {
		return d, r
	}
	// apply_policy, in its order
	if r := checkPriority(body, s); r != nil {
		return d, r
	}
	if !s.AllowEngineState {
		for _, f := range EngineStateFields {
			if m, ok := body.Members[f]; ok && string(m.Raw) != "null" {
				return d, refuse(400, CodeFieldNotAllowed, "this deployment does not let clients set %s; remove it", f)
			}
		}
	}
	key, r := isolationKey(h, body, s, p.header)
	if r != nil {
		return d, r
	}
	limit, hasLimit, r := maxLen(body, s)
	if r != nil {
		return d, r
	}
	if route.ReachesKV && !route.SaltField && s.Mode != Shared {
		return d, refuse(403, CodeRouteNotIsolated, "%s has no cache_salt, so isolation mode %s cannot be enforced on it", route.Path, s.Mode)
	}
	uncacheable := hasLimit && limit == 0
	if uncacheable && route.ReachesKV && !route.SaltField {
		return d, refuse(400, CodeMaxLenNotSupported, "prompt_cache_max_len: 0 cannot be honoured on %s", route.Path)
	}
	if s.IdentityRequired && account == nil {
		return d, refuse(401, CodeIdentityRequired, "this deployment serves authenticated accounts only, and the request has none")
	}
	if key == nil && s.Mode == Required {
		return d, refuse(400, CodeIsolationKeyRequired, "this deployment requires an isolation key")
	}
	switch {
	case uncacheable:
		d.Isolation, d.Salt = IsolationUncacheable, RandomSalt()
	case s.Mode == Shared:
		d.Isolation = IsolationShared
	case key == nil && account == nil:
		d.Isolation = IsolationUnkeyed
	case account != nil:
		d.Isolation, d.Salt = IsolationAccount, accountSalt(p.mac, account.Digest, key)
	default:
		d.Isolation, d.Salt = IsolationKeyed, keyedSalt(p.mac, *key)
	}
	if r := checkUsage(body); r != nil {
		return d, r
	}
	if m, ok := body.Members[UserField]; ok && len(m.Raw) > 0 && m.Raw[0] == '"' {
		var user string
		_ = json.Unmarshal(m.Raw, &user)
		if hasControl(user) || m.Lone {
			return d, refuse(400, CodeInvalidField, "user must not contain control characters (CR, LF, NUL, ...) or invalid Unicode")
		}
	}
	if body.Lone {
		return d, refuse(400, CodeInvalidUnicode, "the request body holds a string that is not valid Unicode (a lone surrogate such as \\ud800)")
	}
	d.Account, d.Key = account, key
	return d, nil
}

// checkHeaders is canonical.py's check_headers over the one value per name GIE keeps.
func checkHeaders(h map[string]string) *Refusal {
	for name, value := range h {
		if !utf8.ValidString(value) {
			return refuse(400, CodeInvalidHeader, "the %s header is not valid UTF-8; send header values as ASCII", name)
		}
	}
	if enc := strings.ToLower(strings.TrimSpace(h["content-encoding"])); enc != "" && enc != "identity" {
		return refuse(415, CodeUnsupportedContentEncode, "Content-Encoding %q is not accepted: send the body uncompressed", enc)
	}
	return nil
}

var zeroText = regexp.MustCompile(`^[+-]?0+(\.0+)?$`)

// checkPriority is policy.py's check_priority: vLLM reads the value as a lax int; one it
// reads as 0 changes nothing, anything else is refused.
func checkPriority(body *Body, s Settings) *Refusal {
	m, ok := body.Members[PriorityField]
	if s.AllowClientPriority || !ok {
		return nil
	}
	var v any
	_ = json.Unmarshal(m.Raw, &v)
	zero := false
	switch x := v.(type) {
	case nil:
		zero = true
	case bool:
		zero = !x
	case float64:
		zero = x == 0
	case string:
		zero = zeroText.MatchString(strings.TrimSpace(x))
	}
	if !zero {
		return refuse(400, CodePriorityNotAllowed, "this deployment does not let clients set a scheduling priority; remove priority")
	}
	return nil
}

func isolationKey(h map[string]string, body *Body, s Settings, header string) (*string, *Refusal) {
	keys := make([]string, 0, 2)
	if s.IsolationHeader != "" {
		if v, ok := h[header]; ok && v != "" {
			keys = append(keys, v)
		}
	}
	lone := false
	if m, ok := body.Members[s.IsolationField]; ok && s.IsolationField != "" && string(m.Raw) != "null" {
		var v any
		_ = json.Unmarshal(m.Raw, &v)
		str, isStr := v.(string)
		if !isStr {
			return nil, refuse(400, CodeInvalidIsolationKey, "%s must be a string", s.IsolationField)
		}
		if str != "" && (len(keys) == 0 || keys[0] != str || m.Lone) {
			keys = append(keys, str)
		}
		lone = m.Lone
	}
	if len(keys) > 1 {
		return nil, refuse(400, CodeInvalidIsolationKey, "the isolation-key header and field carry different isolation keys; send one, or the same value in both")
	}
	if len(keys) == 0 {
		return nil, nil
	}
	key := keys[0]
	if lone {
		return nil, refuse(400, CodeInvalidIsolationKey, "the isolation key is not valid Unicode")
	}
	if n := utf8.RuneCountInString(key); n > MaxIsolationKeyChars {
		return nil, refuse(400, CodeInvalidIsolationKey, "the isolation key has %d characters; at most %d are allowed", n, MaxIsolationKeyChars)
	}
	return &key, nil
}

var intText = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// maxLen is policy.py's max_len: (limit, whether one applies, refusal).
func maxLen(body *Body, s Settings) (int, bool, *Refusal) {
	m, ok := body.Members[PromptCacheMaxLen]
	raw := string(m.Raw)
	if !ok || !s.HonorPromptCacheMaxLen || raw == "null" {
		return 0, false, nil
	}
	if !intText.MatchString(raw) || (strings.HasPrefix(raw, "-") && raw != "-0") {
		return 0, false, refuse(400, CodeInvalidMaxLen, "prompt_cache_max_len must be a non-negative integer (0 disables caching for this request)")
	}
	if strings.TrimPrefix(raw, "-") == "0" {
		return 0, true, nil
	}
	return 1, true, nil // positive: accepted, not enforceable (only 0 changes the salt)
}

// laxBool is pydantic's lax bool (vLLM's request models read stream flags so).
func laxBool(raw []byte) bool {
	switch string(raw) { // the usual values, without a decoder
	case "true", "false", "null":
		return true
	}
	var v any
	_ = json.Unmarshal(raw, &v)
	switch x := v.(type) {
	case nil, bool:
		return true
	case float64:
		return x == 0 || x == 1
	case string:
		switch strings.ToLower(x) {
		case "0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes":
			return true
		}
	}
	return false
}

// checkUsage is the refusing half of policy.py's usage: stream and stream_options read as
// vLLM reads them.
func checkUsage(body *Body) *Refusal {
	if m, ok := body.Members["stream"]; ok && !laxBool(m.Raw) {
		return refuse(400, CodeInvalidField, "stream must be a boolean (true or false)")
	}
	m, ok := body.Members["stream_options"]
	if !ok || string(m.Raw) == "null" {
		return nil
	}
	var options map[string]json.RawMessage
	if m.Raw[0] != '{' || json.Unmarshal(m.Raw, &options) != nil {
		return refuse(400, CodeInvalidField, `stream_options must be an object, e.g. {"include_usage": true}`)
	}
	for _, name := range []string{"include_usage", "continuous_usage_stats"} {
		if raw, ok := options[name]; ok && !laxBool(raw) {
			return refuse(400, CodeInvalidField, "stream_options.%s must be a boolean (true or false)", name)
		}
	}
	return nil
}

// SetSalt makes a decoded body carry the decision's salt: a client's cache_salt never
// passes, the policy's is written (what gateway/decision.py's decide forwards).
func SetSalt(body map[string]any, d Decision) {
	delete(body, CacheSaltField)
	if d.Salt != "" {
		body[CacheSaltField] = d.Salt
	}
}
