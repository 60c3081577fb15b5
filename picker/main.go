// Command epp is promptcache's Endpoint Picker: GIE v1.5.0's picker (runner.Run, every
// upstream flag and plugin unchanged) with promptcache's plugins registered through GIE's
// out-of-tree plugin registry. A config that names none of them runs exactly the upstream
// picker, which is why the tests of `spec.gateway.picker: gie-v1.5` run on this binary.
package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"

	"promptcache.local/picker/plugins/predicted"
	"promptcache.local/picker/plugins/tenantsalt"
)

func main() {
	fwkplugin.Register(tenantsalt.Type, tenantsalt.Factory)
	fwkplugin.Register(predicted.Type, predicted.Factory)
	if err := runner.NewRunner().Run(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}
