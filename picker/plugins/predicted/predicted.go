// Package predicted is the GIE glue of the predicted-match plugin. After GIE's prefix
// producer has hashed the prompt (a PrepareData step that consumes its output, so GIE's
// DAG runs it after the producer), it measures the workload and capacity rungs on the
// producer's own block hashes (package ladder); after the pick (PreRequest) it signs the
// chosen pod's prefix match with those figures (package prediction) into the forwarded
// request's headers. README.md says what it does and takes.
package predicted

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"sync/atomic"
	"time"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	attrprefix "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/prefix"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix"

	"promptcache.local/picker/ladder"
	"promptcache.local/picker/prediction"
	"promptcache.local/picker/tenancy"
)

// Type is the plugin type the EndpointPickerConfig names (contract.PREDICTED_MATCH_PLUGIN).
const Type = "promptcache-predicted-match"

// Defaults of the ladder's bounds (README.md: what they cost and the error they bring).
const (
	DefaultWindowSeconds = 300
	DefaultWindowBlocks  = 1 << 18
	DefaultLRUBlocks     = 1 << 18
	DefaultStrideBlocks  = 4
)

// estimateKey is the endpoint attribute the PrepareData step leaves for PreRequest: the
// endpoints GIE passes are this request's own copies, so nothing outlives the request.
const estimateKey = "promptcache/ladder-estimate"

// Parameters are the plugin's `parameters`, decoded strictly.
type Parameters struct {
	SaltKeyFile   string `json:"saltKeyFile"`
	ProducerName  string `json:"producerName"`
	WindowSeconds int    `json:"windowSeconds"`
	WindowBlocks  int    `json:"windowBlocks"`
	LRUBlocks     int    `json:"lruBlocks"`
	StrideBlocks  int    `json:"strideBlocks"`
}

// Plugin signs the chosen pod's predicted prefix match, with the pool's workload and
// capacity estimates, into the forwarded request.
type Plugin struct {
	name     fwkplugin.TypedName
	signer   *prediction.Signer // the prediction key, keyed once
	now      func() time.Time
	handle   fwkplugin.Handle
	producer string
	state    atomic.Pointer[fwkplugin.PluginState]
	window   *ladder.Window
	lru      *ladder.LRU
	stride   int
}

// TypedName is the plugin's type and configured name.
func (p *Plugin) TypedName() fwkplugin.TypedName { return p.name }

// Produces is nothing another plugin reads (its attribute is its own).
func (p *Plugin) Produces() map[string]any { return map[string]any{} }

// Consumes is the prefix producer's match info: GIE then runs this step after it.
func (p *Plugin) Consumes() map[string]any {
	return map[string]any{attrprefix.PrefixCacheMatchInfoKey: attrprefix.PrefixCacheMatchInfo{}}
}

// New builds the plugin from the salt key the cache front also mounts.
func New(name string, secret []byte, params Parameters, handle fwkplugin.Handle) *Plugin {
	if params.WindowSeconds <= 0 {
		params.WindowSeconds = DefaultWindowSeconds
	}
	if params.WindowBlocks <= 0 {
		params.WindowBlocks = DefaultWindowBlocks
	}
	if params.LRUBlocks <= 0 {
		params.LRUBlocks = DefaultLRUBlocks
	}
	if params.StrideBlocks <= 0 {
		params.StrideBlocks = DefaultStrideBlocks
	}
	return &Plugin{
		name:     fwkplugin.TypedName{Type: Type, Name: name},
		signer:   prediction.NewSigner(prediction.Key(secret)),
		now:      time.Now,
		handle:   handle,
		producer: params.ProducerName,
		window:   ladder.NewWindow(time.Duration(params.WindowSeconds)*time.Second, params.WindowBlocks),
		lru:      ladder.NewLRU(params.LRUBlocks),
		stride:   params.StrideBlocks,
	}
}

// Factory is the plugin factory registered with fwkplugin.Register.
func Factory(name string, raw json.RawMessage, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
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
	if params.WindowSeconds < 0 || params.WindowBlocks < 0 || params.LRUBlocks < 0 || params.StrideBlocks < 0 {
		return nil, fmt.Errorf("%s %q: windowSeconds, windowBlocks, lruBlocks and strideBlocks cannot be negative", Type, name)
	}
	key, err := os.ReadFile(params.SaltKeyFile)
	if err != nil {
		return nil, fmt.Errorf("%s %q: the salt key cannot be read: %w", Type, name, err)
	}
	secret, err := tenancy.CleanSaltKey(key)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %s: %w", Type, name, params.SaltKeyFile, err)
	}
	return New(name, secret, params, handle), nil
}

// estimate is what the PrepareData step measured for a request: the blocks a perfect cache
// and a cache of the pool's size would have held, of the producer's blocks.
type estimate struct{ seen, held, total int }

func (e *estimate) Clone() fwkdl.Cloneable { c := *e; return &c }

type stateful interface {
	PluginState() *fwkplugin.PluginState
}

// producerState is the prefix producer's per-request state, where it keeps the prompt's
// block hashes: the named producer, or the one producer there is (by name, the first).
func (p *Plugin) producerState() *fwkplugin.PluginState {
	if s := p.state.Load(); s != nil {
		return s
	}
	if p.handle == nil {
		return nil
	}
	all := p.handle.GetAllPluginsWithNames()
	names := make([]string, 0, len(all))
	for name, pl := range all {
		if _, ok := pl.(stateful); ok && pl.TypedName().Type == approximateprefix.ApproxPrefixCachePluginType {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	chosen := ""
	for _, name := range names {
		if p.producer == "" || name == p.producer {
			chosen = name
			break
		}
	}
	if chosen == "" {
		return nil
	}
	s := all[chosen].(stateful).PluginState()
	p.state.Store(s)
	return s
}

// poolBlocks is the pool's KV cache in blocks: each candidate's `num_gpu_blocks` as the
// picker scraped it; a pod not yet scraped counts as the average of those that were. 0
// when none was.
func poolBlocks(pods []scheduling.Endpoint) int {
	known, sum := 0, 0
	for _, pod := range pods {
		if m := pod.GetMetrics(); m != nil && m.CacheNumBlocks > 0 {
			known++
			sum += m.CacheNumBlocks
		}
	}
	if known == 0 {
		return 0
	}
	return sum * len(pods) / known
}

// PrepareRequestData measures the workload and capacity rungs for this request on the
// producer's block hashes (its seed holds the model and the tenant's salt, so both are
// measured within the isolation scope), and leaves them on every candidate.
func (p *Plugin) PrepareRequestData(_ context.Context, request *scheduling.LLMRequest, pods []scheduling.Endpoint) error {
	state := p.producerState()
	if state == nil || request == nil {
		return nil
	}
	ctxState, err := fwkplugin.ReadPluginStateKey[*approximateprefix.SchedulingContextState](
		state, request.RequestId, fwkplugin.StateKey(approximateprefix.ApproxPrefixCachePluginType))
	if err != nil || ctxState == nil {
		return nil // nothing hashed (a short prompt, no body): no estimate
	}
	capacity := poolBlocks(pods)
	if capacity == 0 {
		return nil // the pods' KV size is not known yet
	}
	// Every stride-th block and the last only (ladder.Tracked): the prefix is found to
	// within half a stride either way (ladder.Credited), at about 1/stride of the work and
	// the memory; the cache simulated holds capacity/stride of them.
	total := len(ctxState.PrefixHashes)
	tracked := ladder.Tracked(total, p.stride)
	hashes := make([]uint64, len(tracked))
	for i, at := range tracked {
		hashes[i] = uint64(ctxState.PrefixHashes[at])
	}
	e := &estimate{
		seen:  ladder.Credited(tracked, p.window.Observe(hashes, p.now())),
		held:  ladder.Credited(tracked, p.lru.Observe(hashes, capacity/p.stride)),
		total: total,
	}
	for _, pod := range pods {
		pod.Put(estimateKey, e)
	}
	return nil
}

// Of is the prediction for endpoint: the prefix match GIE's producer left on it, with the
// ladder's estimate when there is one for the same blocks.
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
	if raw, ok := endpoint.Get(estimateKey); ok {
		if e, ok := raw.(*estimate); ok && e.total == p.TotalBlocks {
			p.Estimated, p.SeenBlocks, p.HeldBlocks = true, e.seen, e.held
		}
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
				value = p.signer.Sign(pred, p.now().Unix(), nil)
			}
		}
	}
	if _, sent := request.Headers[prediction.Header]; sent || value != "" {
		request.Headers[prediction.Header] = value
	}
}
