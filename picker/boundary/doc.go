// Package boundary bounds what one ext_proc stream may make the picker hold and for how
// long, in front of GIE v1.5.0's handler, which buffers a request body with neither a size
// cap nor a deadline (handlers/server.go appends every chunk until end_of_stream) and
// whose runner builds its gRPC server with no options (pkg/epp/server/runserver.go:
// grpc.NewServer(), no interceptors, no listener of ours).
//
// Three bounds, each refused or ended the way the gateway policy step ends it
// (operator/promptcache/gateway/policy_step.py), so a client sees one behaviour whichever
// picker it reaches:
//
//   - a body cap: a request whose body passes MaxBodyBytes gets an ImmediateResponse 413
//     (`request_too_large`, the front's body) and the chunk that passed it never reaches
//     GIE, so GIE holds at most the cap of it;
//   - a body deadline: a body that has not ended BodyTimeout after its request headers (or
//     its first chunk) gets an ImmediateResponse 408 (`body_timeout`) and the stream ends;
//   - a send deadline: an answer the gateway does not take within BodyTimeout (a stream
//     that stopped being read) ends the stream with DEADLINE_EXCEEDED, which frees what the
//     handler held for it.
//
// The logic of one stream (meter.go) is plain Go; guard.go applies it to a grpc.ServerStream
// around any ext_proc stream handler. No GIE import: Install (install.go) puts the guard
// in front of the ext_proc service's registered handler, which is how GIE's runner, with no
// hook of its own, serves through it.
package boundary
