package boundary

import (
	"fmt"
	"sync"

	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
)

// Install puts the limits in front of every ext_proc server registered afterwards in
// this process, GIE's included; observe (may be nil) hears each stream it ends. limits is called once, at the first stream (after the
// runner parsed its flags); with no bound set, streams go straight to the handler.
//
// Why this way: GIE v1.5.0's runner builds its gRPC server itself with no options (no
// interceptor can be passed), listens itself (no listener can be wrapped), and offers no
// hook for its ext_proc server (pkg/epp/server/runserver.go, AsRunnable); composing its
// pieces ourselves would mean copying its runner's setup. It registers its handler through
// go-control-plane's RegisterExternalProcessorServer, which hands the service descriptor
// ExternalProcessor_ServiceDesc to grpc's RegisterService. The descriptor's stream handler
// is replaced here by the same handler behind Wrap, before the runner starts. The
// generated code asks that the descriptor not be modified: the versions are pinned
// (go.mod), and the tests register a server as GIE does and check that it is guarded.
// Call once, before the runner runs.
func Install(limits func() Limits, observe Observer) error {
	desc := &extProcPb.ExternalProcessor_ServiceDesc
	if len(desc.Streams) != 1 || desc.Streams[0].StreamName != "Process" || desc.Streams[0].Handler == nil {
		return fmt.Errorf("the ext_proc service descriptor is not the one this build knows (%d streams)", len(desc.Streams))
	}
	streams := append(desc.Streams[:0:0], desc.Streams...)
	streams[0].Handler = lazy(streams[0].Handler, limits, observe)
	desc.Streams = streams
	return nil
}

// lazy is Wrap with the limits read at the first stream.
func lazy(next grpc.StreamHandler, limits func() Limits, observe Observer) grpc.StreamHandler {
	var once sync.Once
	var h grpc.StreamHandler
	return func(srv any, ss grpc.ServerStream) error {
		once.Do(func() { h = Wrap(next, limits(), observe) })
		return h(srv, ss)
	}
}
