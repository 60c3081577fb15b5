// Package predicted is the GIE glue of the predicted-match plugin: a PreRequest plugin that
// reads the prefix match GIE's producer put on the chosen endpoint and sends it, signed
// (package prediction), to that pod in the request's headers. README.md says what it
// does and takes.
package predicted

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	attrprefix "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/prefix"

	"promptcache.local/picker/prediction"
	"promptcache.local/picker/tenancy"
)

// Type is the plugin type the EndpointPickerConfig names (contract.PREDICTED_MATCH_PLUGIN).
const Type = "promptcache-predicted-match"

// Parameters are the plugin's `parameters`, decoded strictly.
type Parameters struct {
	SaltKeyFile string `json:"saltKeyFile"`
}

// Plugin signs the chosen pod's predicted prefix match into the forwarded request.
type Plugin struct {
	name fwkplugin.TypedName
	key  []byte
	now  func() time.Time
}

// TypedName is the plugin's type and configured name.
func (p *Plugin) TypedName() fwkplugin.TypedName { return p.name }

// New builds the plugin from the salt key the cache front also mounts.
func New(name string, secret []byte) *Plugin {
	return &Plugin{
		name: fwkplugin.TypedName{Type: Type, Name: name},
		key:  prediction.Key(secret),
		now:  time.Now,
	}
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
	if params.SaltKeyFile == "" {
		return nil, fmt.Errorf("%s %q: saltKeyFile is required (the salt Secret the cache front mounts: the front believes a prediction signed with it only)", Type, name)
	}
	raw, err := os.ReadFile(params.SaltKeyFile)
	if err != nil {
		return nil, fmt.Errorf("%s %q: the salt key cannot be read: %w", Type, name, err)
	}
	secret, err := tenancy.CleanSaltKey(raw)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %s: %w", Type, name, params.SaltKeyFile, err)
	}
	return New(name, secret), nil
}

// Of is the prediction GIE's prefix producer left on the endpoint (its
// PrefixCacheMatchInfo), if it left one that can be sent.
func Of(endpoint scheduling.Endpoint) (prediction.Prediction, bool) {
	info, ok := endpoint.Get(attrprefix.PrefixCacheMatchInfoKey)
	if !ok {
		return prediction.Prediction{}, false
	}
	match, ok := info.(*attrprefix.PrefixCacheMatchInfo)
	if !ok || match == nil {
		return prediction.Prediction{}, false
	}
	p := prediction.Prediction{
		MatchBlocks: match.MatchBlocks(), TotalBlocks: match.TotalBlocks(), BlockTokens: match.BlockSizeTokens(),
	}
	return p, p.Valid()
}

// PreRequest runs after the pick, before GIE builds the forwarded request's headers from
// request.Headers (handlers/server.go: HandleRequest, then generateRequestHeaderResponse):
// the primary profile's first endpoint is the pod the request goes to. A client's own copy
// of the header is always overwritten (GIE sets headers, and cannot remove one; the front
// reads an empty value as no prediction).
func (p *Plugin) PreRequest(_ context.Context, request *scheduling.LLMRequest, result *scheduling.SchedulingResult) {
	if request == nil || request.Headers == nil {
		return
	}
	value := ""
	if result != nil {
		if primary := result.ProfileResults[result.PrimaryProfileName]; primary != nil && len(primary.TargetEndpoints) > 0 {
			if pred, ok := Of(primary.TargetEndpoints[0]); ok {
				value = prediction.Sign(p.key, pred, p.now().Unix(), nil)
			}
		}
	}
	if _, sent := request.Headers[prediction.Header]; sent || value != "" {
		request.Headers[prediction.Header] = value
	}
}
