// Command epp is promptcache's Endpoint Picker: GIE v1.5.0's picker (runner.Run, every
// upstream flag and plugin unchanged) with promptcache's plugins registered through GIE's
// out-of-tree plugin registry, and request bodies bounded when the flags of package
// boundary say so. A config that names none of the plugins, run without those flags, is
// exactly the upstream picker, which is why the tests of `spec.gateway.picker: gie-v1.5`
// run on this binary.
package main

import (
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	ctrl "sigs.k8s.io/controller-runtime"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"

	"promptcache.local/picker/boundary"
	"promptcache.local/picker/plugins/predicted"
	"promptcache.local/picker/plugins/sessionaffinity"
	"promptcache.local/picker/plugins/tenantsalt"
)

func main() {
	fwkplugin.Register(tenantsalt.Type, tenantsalt.Factory)
	fwkplugin.Register(sessionaffinity.Type, sessionaffinity.Factory)
	fwkplugin.Register(predicted.Type, predicted.Factory)
	// GIE's runner parses pflag.CommandLine, so flags defined on it here are parsed (and
	// refused when invalid) with GIE's own; the guard reads them at the first stream.
	flags := boundary.AddFlags(pflag.CommandLine)
	// Counted where GIE's own metrics are served (controller-runtime's registry, the
	// --metrics-port endpoint): GIE never sees these streams' ends as errors of its own.
	ended := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "promptcache_picker_body_refusals_total",
		Help: "Streams the body bounds ended, by reason: request_too_large (413), body_timeout (408), send_timeout (an answer not read in time).",
	}, []string{"reason"})
	crmetrics.Registry.MustRegister(ended)
	observe := func(o boundary.Outcome) { ended.WithLabelValues(string(o)).Inc() }
	if err := boundary.Install(flags.Limits, observe); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := runner.NewRunner().Run(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}
