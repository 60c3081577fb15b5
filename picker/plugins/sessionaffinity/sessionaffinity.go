// Package sessionaffinity is the GIE glue of the session-affinity plugin: a filter that
// keeps only the pod a request's session is pinned to (when that pod is among the
// endpoints it is given), and a PreRequest hook that pins the session to the pod picked.
// What a session is and how pins live is package sessions (no GIE import); README.md says
// what the plugin does and takes, and where it differs from llm-d's session plugin.
package sessionaffinity

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"promptcache.local/picker/sessions"
)

// Type is the plugin type the EndpointPickerConfig names (contract.SESSION_AFFINITY_PLUGIN).
const Type = "promptcache-session-affinity"

// Parameters are the plugin's `parameters` (contract.SessionParam), decoded strictly and
// all required: the renderer writes every one, so no default lives on this side.
type Parameters struct {
	Header      *string  `json:"header"`
	Sources     []string `json:"sources"`
	TTLSeconds  *int64   `json:"ttlSeconds"`
	MaxSessions *int     `json:"maxSessions"`
}

// Plugin is the session filter and its PreRequest hook, over one store.
type Plugin struct {
	name    fwkplugin.TypedName
	header  string
	sources []sessions.Source
	store   *sessions.Store[podName]
	now     func() time.Time
}

// podName is an endpoint's namespaced name, pointing at GIE's strings (no copy, no
// allocation per lookup): what a pin remembers of its pod.
type podName struct{ namespace, name string }

func nameOf(e scheduling.Endpoint) (podName, bool) {
	m := e.GetMetadata()
	if m == nil {
		return podName{}, false
	}
	return podName{m.NamespacedName.Namespace, m.NamespacedName.Name}, true
}

func (n podName) String() string { return n.namespace + "/" + n.name }

var (
	_ scheduling.Filter         = (*Plugin)(nil)
	_ requestcontrol.PreRequest = (*Plugin)(nil)
)

// TypedName is the plugin's type and configured name.
func (p *Plugin) TypedName() fwkplugin.TypedName { return p.name }

// New builds the plugin. header is the session header's name (looked up lower-cased, as
// Envoy sends header names); ttl and maxSessions must be positive.
func New(name, header string, sources []sessions.Source, ttl time.Duration, maxSessions int) *Plugin {
	return &Plugin{
		name:    fwkplugin.TypedName{Type: Type, Name: name},
		header:  strings.ToLower(header),
		sources: sources,
		store:   sessions.NewStore[podName](ttl, maxSessions),
		now:     time.Now,
	}
}

// Factory is the plugin factory registered with fwkplugin.Register.
func Factory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	p, err := decode(raw)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", Type, name, err)
	}
	sources, err := sessions.ParseSources(p.Sources)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", Type, name, err)
	}
	for _, s := range sources {
		if s == sessions.Header && *p.Header == "" {
			return nil, fmt.Errorf("%s %q: sources name the header but header is empty", Type, name)
		}
	}
	return New(name, *p.Header, sources, time.Duration(*p.TTLSeconds)*time.Second, *p.MaxSessions), nil
}

func decode(raw json.RawMessage) (Parameters, error) {
	var p Parameters
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return p, fmt.Errorf("parameters: %w", err)
	}
	switch {
	case p.Header == nil || p.Sources == nil || p.TTLSeconds == nil || p.MaxSessions == nil:
		return p, errors.New("parameters: header, sources, ttlSeconds and maxSessions are all required")
	case *p.TTLSeconds < 1:
		return p, fmt.Errorf("parameters: ttlSeconds %d: must be at least 1", *p.TTLSeconds)
	case *p.MaxSessions < 1:
		return p, fmt.Errorf("parameters: maxSessions %d: must be at least 1", *p.MaxSessions)
	}
	return p, nil
}

// session is the session the request names, and its store key.
func (p *Plugin) session(req *scheduling.LLMRequest) (sessions.Key, bool) {
	if req == nil {
		return sessions.Key{}, false
	}
	header, present := req.Headers[p.header]
	var body map[string]any
	if req.Body != nil {
		body, _ = req.Body.Payload.(scheduling.PayloadMap)
	}
	id, ok := sessions.ID(p.sources, header, present, body)
	if !ok {
		return sessions.Key{}, false
	}
	return sessions.KeyOf(id), true
}

// Filter keeps only the session's pinned pod when it is among the endpoints given (the
// pool's candidates, less what earlier filters removed); a pin whose pod is not among them
// is released, and the request is placed as if it had none (PreRequest then pins it anew).
func (p *Plugin) Filter(ctx context.Context, _ *scheduling.CycleState, req *scheduling.LLMRequest, endpoints []scheduling.Endpoint) []scheduling.Endpoint {
	key, ok := p.session(req)
	if !ok {
		return endpoints
	}
	pod, ok := p.store.Pinned(key, p.now())
	if !ok {
		return endpoints
	}
	for _, e := range endpoints {
		if n, ok := nameOf(e); ok && n == pod {
			return []scheduling.Endpoint{e}
		}
	}
	p.store.Release(key, pod)
	log.FromContext(ctx).V(1).Info("session's pod is not a candidate: pin released", "pod", pod.String())
	return endpoints
}

// PreRequest pins the request's session to the pod picked (renewing the pin when it is
// the same pod), for ttlSeconds from now.
func (p *Plugin) PreRequest(_ context.Context, req *scheduling.LLMRequest, result *scheduling.SchedulingResult) {
	key, ok := p.session(req)
	if !ok || result == nil {
		return
	}
	primary := result.ProfileResults[result.PrimaryProfileName]
	if primary == nil || len(primary.TargetEndpoints) == 0 {
		return
	}
	if n, ok := nameOf(primary.TargetEndpoints[0]); ok {
		p.store.Pin(key, n, p.now())
	}
}
