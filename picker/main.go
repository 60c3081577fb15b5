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

	"github.com/spf13/pflag"
	ctrl "sigs.k8s.io/controller-runtime"

	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"

	"promptcache.local/picker/boundary"
	"promptcache.local/picker/plugins/tenantsalt"
)

func main() {
	fwkplugin.Register(tenantsalt.Type, tenantsalt.Factory)
	// GIE's runner parses pflag.CommandLine, so flags defined on it here are parsed (and
	// refused when invalid) with GIE's own; the guard reads them at the first stream.
	flags := boundary.AddFlags(pflag.CommandLine)
	if err := boundary.Install(flags.Limits); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := runner.NewRunner().Run(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}
