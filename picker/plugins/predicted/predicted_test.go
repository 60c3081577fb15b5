package predicted

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	k8stypes "k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	attrprefix "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/prefix"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix"

	"promptcache.local/picker/prediction"

	"promptcache.local/picker/testvectors"
)

// Through GIE's own prefix producer (its block hashes, in its plugin state): the first
// request's prefix was never seen; the same prompt again was seen and fits the pool's KV
// (2 pods x 8 blocks); a third prompt long enough to fill the pool pushes it out of the
// simulated cache but not out of the workload window; another tenant's salt shares nothing.
func TestWorkloadAndCapacityOnTheProducersBlocks(t *testing.T) {
	ctx := context.Background()
	handle := fwkplugin.NewEppHandle(ctx, func() []k8stypes.NamespacedName { return nil })
	producer, err := approximateprefix.ApproxPrefixCacheFactory("tier-producer",
		json.RawMessage(`{"blockSizeTokens":4,"maxPrefixBlocksToMatch":64,"lruCapacityPerServer":100}`), handle)
	if err != nil {
		t.Fatal(err)
	}
	handle.AddPlugin("tier-producer", producer)
	p := plugin(t, handle)
	prep := producer.(requestcontrol.PrepareDataPlugin)
	n := 0
	pick := func(prompt, salt string) []string {
		n++
		req := &scheduling.LLMRequest{
			RequestId:   fmt.Sprintf("r%d", n),
			TargetModel: "m",
			Headers:     map[string]string{},
			Body:        &scheduling.LLMRequestBody{Completions: &scheduling.CompletionsRequest{Prompt: scheduling.Prompt{Raw: prompt}, CacheSalt: salt}},
		}
		pods := []scheduling.Endpoint{endpoint("a", nil), endpoint("b", nil)}
		if err := prep.PrepareRequestData(ctx, req, pods); err != nil {
			t.Fatal(err)
		}
		if err := p.PrepareRequestData(ctx, req, pods); err != nil {
			t.Fatal(err)
		}
		p.PreRequest(ctx, req, result(pods[0]))
		return strings.Split(req.Headers[prediction.Header], ".")[3:8]
	}
	first := strings.Repeat("0123456789abcdef", 4) // 4 blocks of 16 characters
	if got := pick(first, ""); strings.Join(got, ".") != "0.4.4.0.0" {
		t.Fatalf("first sight: %v", got)
	}
	if got := pick(first, ""); strings.Join(got[3:], ".") != "4.4" {
		t.Fatalf("seen, and held by the pool's 16 blocks: %v", got)
	}
	if got := pick(first, "pck1-other"); strings.Join(got[3:], ".") != "0.0" {
		t.Fatalf("another scope shares nothing: %v", got)
	}
	pick(strings.Repeat("z", 16*16), "") // 16 blocks: the whole pool
	if got := pick(first, ""); strings.Join(got[3:], ".") != "4.0" {
		t.Fatalf("still in the window, no longer in a pool-sized cache: %v", got)
	}
	// every second block and the last: a prompt seen whole counts whole; one that shares
	// 4 of its 7 blocks is found to share 4 or 5 (blocks 1 and 3 found, 5 not) and is
	// credited the middle, rounded down
	p.stride = 2
	seven := strings.Repeat("abcdefghijklmnop", 7)
	pick(seven, "")
	if got := pick(seven, ""); strings.Join(got[1:], ".") != "7.4.7.7" {
		t.Fatalf("7 blocks, stride 2, seen whole: 7 seen and held, got %v", got)
	}
	if got := pick(seven[:4*16]+strings.Repeat("Q", 3*16), ""); strings.Join(got[3:], ".") != "4.4" {
		t.Fatalf("4 of 7 blocks shared, stride 2: credited 4, got %v", got)
	}
}

var (
	_ requestcontrol.PreRequest        = (*Plugin)(nil) // GIE registers it at both extension points
	_ requestcontrol.PrepareDataPlugin = (*Plugin)(nil)
)

const secret = "  test-salt-key-0123456789abcdef\n"

func plugin(t testing.TB, handle fwkplugin.Handle, strides ...int) *Plugin {
	t.Helper()
	stride := "1"
	if len(strides) > 0 {
		stride = fmt.Sprint(strides[0])
	}
	keyFile := filepath.Join(t.TempDir(), "salt-key")
	if err := os.WriteFile(keyFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Factory("predicted", json.RawMessage(`{"saltKeyFile":"`+keyFile+`","strideBlocks":`+stride+`}`), handle)
	if err != nil {
		t.Fatal(err)
	}
	pl := p.(*Plugin)
	pl.now = func() time.Time { return time.Unix(1_800_000_000, 0) }
	return pl
}

func endpoint(name string, info *attrprefix.PrefixCacheMatchInfo) scheduling.Endpoint {
	meta := &fwkdl.EndpointMetadata{NamespacedName: k8stypes.NamespacedName{Namespace: "ns", Name: name}}
	ep := scheduling.NewEndpoint(meta, &fwkdl.Metrics{CacheNumBlocks: 8}, nil)
	if info != nil {
		ep.Put(attrprefix.PrefixCacheMatchInfoKey, info)
	}
	return ep
}

func result(eps ...scheduling.Endpoint) *scheduling.SchedulingResult {
	targets := make([]scheduling.Endpoint, 0, len(eps))
	for _, ep := range eps {
		targets = append(targets, &scheduling.ScoredEndpoint{Endpoint: ep, Score: 1}) // as GIE's max-score picker returns them
	}
	return &scheduling.SchedulingResult{
		PrimaryProfileName: "default",
		ProfileResults:     map[string]*scheduling.ProfileRunResult{"default": {TargetEndpoints: targets}},
	}
}

func TestParametersAreDecodedStrictly(t *testing.T) {
	if _, err := Factory("x", json.RawMessage(`{"saltKeyFlie":"/x"}`), nil); err == nil {
		t.Fatal("an unknown parameter must stop the picker at start-up")
	}
	if _, err := Factory("x", nil, nil); err == nil {
		t.Fatal("no salt key: nothing the front could believe")
	}
	short := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(short, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Factory("x", json.RawMessage(`{"saltKeyFile":"`+short+`"}`), nil); err == nil {
		t.Fatal("a short salt key must stop the picker")
	}
}

// The chosen pod's match (the first target of the primary profile) is signed into the
// request's headers, which GIE sets on the forwarded request; the other pods' are not.
func TestSignsTheChosenPodsMatch(t *testing.T) {
	p := plugin(t, nil)
	req := &scheduling.LLMRequest{Headers: map[string]string{}}
	chosen := endpoint("a", attrprefix.NewPrefixCacheMatchInfo(7, 12, 16))
	other := endpoint("b", attrprefix.NewPrefixCacheMatchInfo(12, 12, 16))
	p.PreRequest(context.Background(), req, result(chosen, other))
	got := req.Headers[prediction.Header]
	parts := strings.Split(got, ".")
	if len(parts) != 7 || parts[0] != "v1" || parts[1] != "1800000000" || strings.Join(parts[3:6], ".") != "7.12.16" {
		t.Fatalf("header %q", got)
	}
}

// A client's own header never passes: overwritten with the picker's, or blanked when the
// picker has no prediction (no producer in the config, or nothing hashed).
func TestClientCopyNeverPasses(t *testing.T) {
	p := plugin(t, nil)
	forged := "v1.1800000000.AAECAwQFBgcICQoL.12.12.16.xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
	req := &scheduling.LLMRequest{Headers: map[string]string{prediction.Header: forged}}
	p.PreRequest(context.Background(), req, result(endpoint("a", nil)))
	if v, ok := req.Headers[prediction.Header]; !ok || v != "" {
		t.Fatalf("client copy must be blanked, got %q (present %v)", v, ok)
	}
	req = &scheduling.LLMRequest{Headers: map[string]string{prediction.Header: forged}}
	p.PreRequest(context.Background(), req, result(endpoint("a", attrprefix.NewPrefixCacheMatchInfo(0, 3, 16))))
	if v := req.Headers[prediction.Header]; v == forged || !strings.Contains(v, ".0.3.16.") {
		t.Fatalf("client copy must be replaced, got %q", v)
	}
	req = &scheduling.LLMRequest{Headers: map[string]string{}}
	p.PreRequest(context.Background(), req, result(endpoint("a", nil)))
	if _, ok := req.Headers[prediction.Header]; ok {
		t.Fatal("no prediction and no client copy: no header at all")
	}
}

// The renderer writes this plugin's type and parameters (contract.PREDICTED_MATCH_PLUGIN,
// contract.PredictedMatchParam); the vectors carry them.
func TestTypeAndParametersAreTheContracts(t *testing.T) {
	raw := testvectors.Prediction
	var v struct {
		Contract struct {
			Plugin     string   `json:"plugin"`
			Parameters []string `json:"parameters"`
		}
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if v.Contract.Plugin != Type {
		t.Errorf("Type %q, the renderer writes %q", Type, v.Contract.Plugin)
	}
	var tags []string
	typ := reflect.TypeOf(Parameters{})
	for i := 0; i < typ.NumField(); i++ {
		tags = append(tags, strings.Split(typ.Field(i).Tag.Get("json"), ",")[0])
	}
	slices.Sort(tags)
	if !slices.Equal(tags, v.Contract.Parameters) {
		t.Errorf("parameters %v, the renderer writes %v", tags, v.Contract.Parameters)
	}
}
