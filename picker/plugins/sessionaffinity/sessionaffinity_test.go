package sessionaffinity

import (
	"context"
	"encoding/json"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"promptcache.local/picker/sessions"

	"promptcache.local/picker/testvectors"
)

func endpoint(name string) scheduling.Endpoint {
	m := &fwkdl.EndpointMetadata{Address: "10.0.0.1", Port: "8000"}
	m.NamespacedName.Namespace, m.NamespacedName.Name = "ns", name
	return scheduling.NewEndpoint(m, fwkdl.NewMetrics(), fwkdl.NewAttributes())
}

func request(headers map[string]string, body map[string]any) *scheduling.LLMRequest {
	return &scheduling.LLMRequest{Headers: headers, Body: &scheduling.LLMRequestBody{Payload: scheduling.PayloadMap(body)}}
}

func picked(e scheduling.Endpoint) *scheduling.SchedulingResult {
	return &scheduling.SchedulingResult{
		PrimaryProfileName: "default",
		ProfileResults:     map[string]*scheduling.ProfileRunResult{"default": {TargetEndpoints: []scheduling.Endpoint{e}}},
	}
}

func names(es []scheduling.Endpoint) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.GetMetadata().NamespacedName.Name)
	}
	return out
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newPlugin(t *testing.T, raw string) (*Plugin, *clock) {
	t.Helper()
	pl, err := Factory("s", json.RawMessage(raw), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := pl.(*Plugin)
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	p.now = c.now
	return p, c
}

const params = `{"header": "X-Session-Affinity", "sources": ["header", "prompt_cache_key", "user"], "ttlSeconds": 60, "maxSessions": 100}`

func TestPinFollowsThePickAndNarrowsTheNext(t *testing.T) {
	p, c := newPlugin(t, params)
	ctx := context.Background()
	pool := []scheduling.Endpoint{endpoint("a"), endpoint("b"), endpoint("c")}
	req := request(map[string]string{"x-session-affinity": "alice"}, nil)
	if got := p.Filter(ctx, nil, req, pool); len(got) != 3 {
		t.Fatalf("an unpinned session narrows nothing: %v", names(got))
	}
	p.PreRequest(ctx, req, picked(pool[1]))
	if got := names(p.Filter(ctx, nil, req, pool)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("pinned session: %v", got)
	}
	// the body names the same session for a client without the header
	if got := names(p.Filter(ctx, nil, request(nil, map[string]any{"user": "alice"}), pool)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("same session from `user`: %v", got)
	}
	if got := p.Filter(ctx, nil, request(map[string]string{"x-session-affinity": "bob"}, nil), pool); len(got) != 3 {
		t.Fatalf("another session is not narrowed: %v", names(got))
	}
	if got := p.Filter(ctx, nil, request(nil, nil), pool); len(got) != 3 {
		t.Fatalf("no session: %v", names(got))
	}
	c.t = c.t.Add(time.Minute)
	if got := p.Filter(ctx, nil, req, pool); len(got) != 3 {
		t.Fatalf("after ttl the pin is gone: %v", names(got))
	}
}

func TestPodLeavingThePoolReleasesThePin(t *testing.T) {
	p, _ := newPlugin(t, params)
	ctx := context.Background()
	a, b, c := endpoint("a"), endpoint("b"), endpoint("c")
	req := request(map[string]string{"x-session-affinity": "alice"}, nil)
	p.PreRequest(ctx, req, picked(a))
	without := []scheduling.Endpoint{b, c}
	if got := p.Filter(ctx, nil, req, without); len(got) != 2 {
		t.Fatalf("pinned pod gone: %v", names(got))
	}
	if p.store.Len() != 0 {
		t.Fatal("the pin of a pod that left was kept")
	}
	p.PreRequest(ctx, req, picked(c))
	back := []scheduling.Endpoint{a, b, c}
	if got := names(p.Filter(ctx, nil, req, back)); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("the session stays on its new pod when the old one returns: %v", got)
	}
}

func TestParametersAreStrictAndRequired(t *testing.T) {
	for _, bad := range []string{
		`{}`,
		`{"header": "x", "sources": ["header"], "ttlSeconds": 60}`,
		`{"header": "x", "sources": ["header"], "ttlSeconds": 60, "maxSessions": 10, "extra": 1}`,
		`{"header": "x", "sources": ["cookie"], "ttlSeconds": 60, "maxSessions": 10}`,
		`{"header": "x", "sources": ["header"], "ttlSeconds": 0, "maxSessions": 10}`,
		`{"header": "x", "sources": ["header"], "ttlSeconds": 60, "maxSessions": 0}`,
		`{"header": "", "sources": ["header"], "ttlSeconds": 60, "maxSessions": 10}`,
		`{"header": "x", "sources": [], "ttlSeconds": 60, "maxSessions": 10}`,
		`{"header": "x", "sources": ["header"], "ttlSeconds": 1.5, "maxSessions": 10}`,
	} {
		if _, err := Factory("s", json.RawMessage(bad), nil); err == nil {
			t.Errorf("accepted %s", bad)
		} else if !strings.Contains(err.Error(), Type) {
			t.Errorf("error does not name the plugin: %v", err)
		}
	}
	if _, err := Factory("s", json.RawMessage(`{"header": "", "sources": ["user"], "ttlSeconds": 1, "maxSessions": 1}`), nil); err != nil {
		t.Errorf("body-only sessions need no header: %v", err)
	}
}

// The renderer writes this plugin's type, parameters and sources (contract.session); the
// vectors carry them, so a name changed on one side fails here.
func TestTypeAndParametersAreTheContracts(t *testing.T) {
	raw := testvectors.Vectors
	var v struct {
		Contract struct {
			Plugin     string   `json:"session_affinity_plugin"`
			Parameters []string `json:"session_affinity_parameters"`
			Sources    []string `json:"session_sources"`
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
	if _, err := sessions.ParseSources(v.Contract.Sources); err != nil {
		t.Error(err)
	}
}

// The bytes one tracked session costs with the pod names the plugin keeps (README.md
// quotes it): a full store's heap over its sessions, names shared with GIE's endpoints.
func TestBytesPerSessionAsThePluginKeepsThem(t *testing.T) {
	const n = 65536
	pods := []podName{{"ns", "pool-0"}, {"ns", "pool-1"}, {"ns", "pool-2"}}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := sessions.NewStore[podName](time.Hour, n)
	now := time.Unix(1_800_000_000, 0)
	for i := range n {
		s.Pin(sessions.KeyOf(strconv.Itoa(i)), pods[i%3], now)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per tracked session, %.1f MiB for %d", per, per*n/(1<<20), n)
	if per > 256 {
		t.Errorf("%.0f bytes per session; the README's bound assumes at most 256", per)
	}
	runtime.KeepAlive(s)
}
