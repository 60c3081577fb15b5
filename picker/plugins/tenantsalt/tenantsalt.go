// Package tenantsalt is the GIE glue of the tenant-salt request parser: GIE's OpenAI
// parser, then promptcache's policy (package tenancy) on the same request, whose salt is
// set where GIE's prefix producer hashes it and in the body GIE forwards to the pod, with
// the signed account header for the cache front. README.md says what it does and takes.
package tenantsalt

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requesthandling/parsers/openai"

	"promptcache.local/picker/tenancy"
)

// Type is the plugin type the EndpointPickerConfig names (`parser.pluginRef` selects it).
const Type = "promptcache-tenant-salt"

// Parameters are the plugin's `parameters`, decoded strictly (an unknown key stops the
// picker at start-up, as the renderer's tests expect of every picker plugin).
type Parameters struct {
	SaltKeyFile            string  `json:"saltKeyFile"`
	IsolationMode          string  `json:"isolationMode"`
	IsolationHeader        *string `json:"isolationHeader"`
	IsolationField         *string `json:"isolationField"`
	HonorPromptCacheMaxLen *bool   `json:"honorPromptCacheMaxLen"`
	AllowClientPriority    bool    `json:"allowClientPriority"`
	AllowEngineState       bool    `json:"allowEngineState"`
	IdentityHeader         string  `json:"identityHeader"`
	IdentityBearer         bool    `json:"identityBearer"`
	IdentityRequired       bool    `json:"identityRequired"`
}

// Settings are the parameters over tenancy's defaults, checked.
func (p Parameters) Settings() (tenancy.Settings, error) {
	s := tenancy.DefaultSettings()
	if p.IsolationMode != "" {
		s.Mode = tenancy.IsolationMode(p.IsolationMode)
	}
	if p.IsolationHeader != nil {
		s.IsolationHeader = *p.IsolationHeader
	}
	if p.IsolationField != nil {
		s.IsolationField = *p.IsolationField
	}
	if p.HonorPromptCacheMaxLen != nil {
		s.HonorPromptCacheMaxLen = *p.HonorPromptCacheMaxLen
	}
	s.AllowClientPriority, s.AllowEngineState = p.AllowClientPriority, p.AllowEngineState
	s.IdentityHeader, s.IdentityBearer, s.IdentityRequired = p.IdentityHeader, p.IdentityBearer, p.IdentityRequired
	return s, s.Check()
}

// Parser is GIE's OpenAI parser with the tenant's salt set.
type Parser struct {
	*openai.OpenAIParser
	name     fwkplugin.TypedName
	settings tenancy.Settings
	policy   *tenancy.Policy // the settings and salt key, prepared once
	signKey  *tenancy.MAC    // the attestation key, keyed once (nil: no account is signed)
	now      func() time.Time
}

// TypedName is the plugin's type and configured name.
func (p *Parser) TypedName() fwkplugin.TypedName { return p.name }

// New builds the parser from its settings and salt key (nil in mode Shared).
func New(name string, s tenancy.Settings, secret []byte) *Parser {
	p := &Parser{
		OpenAIParser: openai.NewOpenAIParser(),
		name:         fwkplugin.TypedName{Type: Type, Name: name},
		settings:     s,
		policy:       tenancy.NewPolicy(s, secret),
		now:          time.Now,
	}
	if secret != nil && s.ByAccount() {
		p.signKey = tenancy.NewMAC(tenancy.AttestationKey(secret))
	}
	return p
}

// Factory is the plugin factory registered with fwkplugin.Register.
func Factory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	var params Parameters
	if len(raw) > 0 {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&params); err != nil {
			return nil, fmt.Errorf("%s %q: parameters: %w", Type, name, err)
		}
	}
	s, err := params.Settings()
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", Type, name, err)
	}
	var secret []byte
	if s.NeedsSaltKey() {
		if params.SaltKeyFile == "" {
			return nil, fmt.Errorf("%s %q: isolation mode %s needs saltKeyFile (the salt Secret the cache front mounts)", Type, name, s.Mode)
		}
		if secret, err = tenancy.ReadSaltKey(s, params.SaltKeyFile); err != nil {
			return nil, fmt.Errorf("%s %q: %w", Type, name, err)
		}
	}
	return New(name, s, secret), nil
}

// ParseRequest parses as GIE does, then decides the tenant's salt: the prefix producer
// hashes it (the typed body), the pod receives it (the map GIE re-encodes as the body it
// forwards), and an account travels signed in the identity header. `headers` is GIE's
// request-header map, whose entries GIE sets on the forwarded request.
func (p *Parser) ParseRequest(ctx context.Context, body []byte, headers map[string]string) (*scheduling.LLMRequestBody, error) {
	parsed, err := p.OpenAIParser.ParseRequest(ctx, body, headers)
	if err != nil {
		return nil, err
	}
	d := p.policy.Decide(tenancy.Request{Headers: headers, Body: body})
	setTypedSalt(parsed, d.Salt)
	if d.Refusal != nil {
		// The cache front answers it after the pick; here it only must attract nothing. It
		// gets the client's very bytes (GIE forwards a RawPayload as it came, where it would
		// re-encode a map: a lone surrogate, a duplicate or case-folded member would come
		// out valid and be served), so it refuses with the step's status and body.
		log.FromContext(ctx).V(1).Info("request the cache front will refuse", "status", d.Refusal.Status, "code", d.Refusal.Code)
		parsed.Payload = scheduling.RawPayload(body)
	}
	payload, _ := parsed.Payload.(scheduling.PayloadMap)
	if payload != nil {
		tenancy.SetSalt(payload, d)
	}
	if _, sent := headers[tenancy.IdentityHeader]; sent {
		headers[tenancy.IdentityHeader] = "" // a client's copy never passes (GIE can only set headers)
	}
	if d.Account != nil && p.signKey != nil && payload != nil {
		digest, err := tenancy.BodyDigest(payload)
		if err != nil {
			return nil, err
		}
		var keyValues []string
		if v, ok := headers[lower(p.settings.IsolationHeader)]; ok && p.settings.IsolationHeader != "" {
			keyValues = []string{v}
		}
		headers[tenancy.IdentityHeader] = tenancy.SignWith(p.signKey, *d.Account, keyValues, digest, p.now().Unix(), nil)
	}
	return parsed, nil
}

func setTypedSalt(parsed *scheduling.LLMRequestBody, salt string) {
	switch {
	case parsed.ChatCompletions != nil:
		parsed.ChatCompletions.CacheSalt = salt
	case parsed.Completions != nil:
		parsed.Completions.CacheSalt = salt
	case parsed.Responses != nil:
		parsed.Responses.CacheSalt = salt
	case parsed.Conversations != nil:
		parsed.Conversations.CacheSalt = salt
	case parsed.Embeddings != nil:
		parsed.Embeddings.CacheSalt = salt
	}
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
