// Pins the modules whose YAML the local cluster installs: Gateway API (HTTPRoute and
// friends, standard channel) and the InferencePool CRD (inference.networking.k8s.io/v1);
// and the Prometheus Operator's CRDs, which `up` does not install (`which monitoring-crds`).
// Nothing here is compiled; `e2e/cluster` runs `go mod download` and reads the CRDs
// from the module cache, verified against go.sum.
module promptcache.local/e2e/tools/crds

go 1.26.0

require (
	github.com/prometheus-operator/prometheus-operator v0.85.0
	sigs.k8s.io/gateway-api v1.6.3
	sigs.k8s.io/gateway-api-inference-extension v1.4.0
)
