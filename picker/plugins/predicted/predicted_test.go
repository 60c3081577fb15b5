package predicted

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	k8stypes "k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	attrprefix "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/prefix"

	"promptcache.local/picker/prediction"
)

var _ requestcontrol.PreRequest = (*Plugin)(nil) // GIE registers it at this extension point

const secret = "  test-salt-key-0123456789abcdef\n"

func plugin(t *testing.T) *Plugin {
	t.Helper()
	keyFile := filepath.Join(t.TempDir(), "salt-key")
	if err := os.WriteFile(keyFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Factory("predicted", json.RawMessage(`{"saltKeyFile":"`+keyFile+`"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	pl := p.(*Plugin)
	pl.now = func() time.Time { return time.Unix(1_800_000_000, 0) }
	return pl
}

func endpoint(name string, info *attrprefix.PrefixCacheMatchInfo) scheduling.Endpoint {
	meta := &fwkdl.EndpointMetadata{NamespacedName: k8stypes.NamespacedName{Namespace: "ns", Name: name}}
	ep := scheduling.NewEndpoint(meta, &fwkdl.Metrics{}, nil)
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
	p := plugin(t)
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
	p := plugin(t)
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
	raw, err := os.ReadFile("../../testdata/prediction_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
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
