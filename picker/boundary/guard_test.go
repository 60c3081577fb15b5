package boundary

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// buffering answers as GIE v1.5.0's handler does (handlers/server.go): it appends body
// chunks until end_of_stream, then answers the headers and sends the body back in 62,000
// byte chunks. It stands in for GIE here so the guard is tested alone; the e2e tests
// (e2e/test_picker_boundary.py) run the real picker.
type buffering struct {
	extProcPb.UnimplementedExternalProcessorServer
	maxHeld atomic.Int64
	exited  chan error
	deep    bool // answer from deep in the stack, as GIE's handler does (BenchmarkExchange)
}

// depth uses about 32 KiB of stack (GIE's handler grows a new goroutine's stack to about
// that in encoding/json and OpenTelemetry), so a benchmark sees what growing it costs.
//
//go:noinline
func depth(n int) byte {
	var frame [256]byte
	frame[n%256] = byte(n)
	if n == 0 {
		return frame[0]
	}
	return frame[n%256] + depth(n-1)
}

func (b *buffering) Process(srv extProcPb.ExternalProcessor_ProcessServer) (err error) {
	defer func() { b.exited <- err }()
	var body []byte
	for {
		req, err := srv.Recv()
		if err == io.EOF || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return err
		}
		rb, ok := req.Request.(*extProcPb.ProcessingRequest_RequestBody)
		if !ok {
			continue
		}
		body = append(body, rb.RequestBody.Body...)
		if n := int64(len(body)); n > b.maxHeld.Load() {
			b.maxHeld.Store(n)
		}
		if !rb.RequestBody.EndOfStream {
			continue
		}
		if b.deep {
			_ = depth(120)
		}
		if err := srv.Send(&extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_RequestHeaders{RequestHeaders: &extProcPb.HeadersResponse{}}}); err != nil {
			return err
		}
		for len(body) > 0 {
			n := min(len(body), 62000)
			chunk := &extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_RequestBody{RequestBody: &extProcPb.BodyResponse{
				Response: &extProcPb.CommonResponse{BodyMutation: &extProcPb.BodyMutation{Mutation: &extProcPb.BodyMutation_Body{Body: body[:n]}}},
			}}}
			if err := srv.Send(chunk); err != nil {
				return err
			}
			body = body[n:]
		}
	}
}

// serve runs a real gRPC server on loopback with the buffering handler behind the limits,
// registered the way GIE registers its own (RegisterExternalProcessorServer) after the
// descriptor was given the guard.
func serve(t testing.TB, limits Limits) (*buffering, extProcPb.ExternalProcessorClient) {
	t.Helper()
	desc := extProcPb.ExternalProcessor_ServiceDesc
	desc.Streams = append(desc.Streams[:0:0], desc.Streams...)
	desc.Streams[0].Handler = Wrap(desc.Streams[0].Handler, limits, nil)
	srv := grpc.NewServer()
	b := &buffering{exited: make(chan error, 16)}
	srv.RegisterService(&desc, b)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	// A fixed 64 KiB window (no growth by bandwidth probing): what a client that stops
	// reading leaves the server to hold is then small and known.
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(65535), grpc.WithInitialConnWindowSize(65535))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return b, extProcPb.NewExternalProcessorClient(conn)
}

func headers(eos bool) *extProcPb.ProcessingRequest {
	return &extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_RequestHeaders{RequestHeaders: &extProcPb.HttpHeaders{EndOfStream: eos}}}
}

func chunk(n int, eos bool) *extProcPb.ProcessingRequest {
	return &extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_RequestBody{RequestBody: &extProcPb.HttpBody{Body: make([]byte, n), EndOfStream: eos}}}
}

func immediate(t *testing.T, stream extProcPb.ExternalProcessor_ProcessClient) *extProcPb.ImmediateResponse {
	t.Helper()
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("want an immediate response, got %v", err)
	}
	ir := resp.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("want an immediate response, got %v", resp)
	}
	return ir
}

func exitWithin(t *testing.T, b *buffering, d time.Duration) error {
	t.Helper()
	select {
	case err := <-b.exited:
		return err
	case <-time.After(d):
		t.Fatalf("the handler still holds its stream after %v", d)
		return nil
	}
}

func TestABodyOverTheCapIs413AndTheHandlerNeverHoldsMore(t *testing.T) {
	b, client := serve(t, Limits{MaxBodyBytes: 100_000, BodyTimeout: 10 * time.Second})
	stream, err := client.Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(headers(false))
	for range 10 { // 10 x 16 KiB: the cap passes at the seventh chunk
		if err := stream.Send(chunk(16384, false)); err != nil {
			break
		}
	}
	ir := immediate(t, stream)
	if ir.Status.GetCode() != 413 || ir.Details != CodeRequestTooLarge || string(ir.Body) != string(TooLarge(7*16384, 100_000).Body()) {
		t.Fatalf("got %d %s %s", ir.Status.GetCode(), ir.Details, ir.Body)
	}
	if err := exitWithin(t, b, 5*time.Second); err != nil {
		t.Fatalf("handler ended with %v", err)
	}
	if held := b.maxHeld.Load(); held > 100_000 {
		t.Fatalf("the handler held %d bytes, over the cap", held)
	}
}

func TestABodyThatNeverEndsIs408AtItsDeadline(t *testing.T) {
	b, client := serve(t, Limits{MaxBodyBytes: 1 << 20, BodyTimeout: 300 * time.Millisecond})
	stream, err := client.Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_ = stream.Send(headers(false))
	_ = stream.Send(chunk(10, false))
	ir := immediate(t, stream)
	took := time.Since(start)
	if ir.Status.GetCode() != 408 || ir.Details != CodeBodyTimeout || string(ir.Body) != string(BodyTimeout(0.3).Body()) {
		t.Fatalf("got %d %s %s", ir.Status.GetCode(), ir.Details, ir.Body)
	}
	if took < 300*time.Millisecond {
		t.Fatalf("refused after %v, before its deadline", took)
	}
	if err := exitWithin(t, b, 5*time.Second); err != nil && status.Code(err) != codes.Canceled {
		t.Logf("handler ended with %v", err) // its Recv was cancelled: either is an end
	}
}

func TestAStreamNobodyReadsEndsAtTheSendDeadline(t *testing.T) {
	b, client := serve(t, Limits{MaxBodyBytes: 8 << 20, BodyTimeout: time.Second})
	stream, err := client.Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// A whole 1 MiB body, in time; its echo (GIE sends the body back) is never read.
	_ = stream.Send(headers(false))
	for i := range 16 {
		if err := stream.Send(chunk(65536, i == 15)); err != nil {
			t.Fatal(err)
		}
	}
	err = exitWithin(t, b, 5*time.Second)
	if err == nil {
		t.Fatal("the handler finished sending to a client that reads nothing")
	}
	// The client sees the stream ended by the deadline once it looks.
	for {
		if _, err := stream.Recv(); err != nil {
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("stream ended with %v, want DEADLINE_EXCEEDED", err)
			}
			break
		}
	}
}

func TestAWellBehavedRequestPassesUntouched(t *testing.T) {
	b, client := serve(t, Limits{MaxBodyBytes: 1 << 20, BodyTimeout: 2 * time.Second})
	for range 20 {
		stream, err := client.Process(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		_ = stream.Send(headers(false))
		_ = stream.Send(chunk(1<<20, true)) // exactly the cap
		var got int
		if _, err := stream.Recv(); err != nil { // the headers' answer
			t.Fatal(err)
		}
		for got < 1<<20 {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			got += len(resp.GetRequestBody().GetResponse().GetBodyMutation().GetBody())
		}
		_ = stream.CloseSend()
		if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("want the stream's end, got %v", err)
		}
		if err := exitWithin(t, b, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

func TestInstallGuardsWhatRegistersAfterIt(t *testing.T) {
	orig := extProcPb.ExternalProcessor_ServiceDesc.Streams
	t.Cleanup(func() { extProcPb.ExternalProcessor_ServiceDesc.Streams = orig })
	var heard atomic.Value
	if err := Install(func() Limits { return Limits{MaxBodyBytes: 10} }, func(o Outcome) { heard.Store(o) }); err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	b := &buffering{exited: make(chan error, 4)}
	extProcPb.RegisterExternalProcessorServer(srv, b) // as GIE's runner registers its own
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := extProcPb.NewExternalProcessorClient(conn).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(headers(false))
	_ = stream.Send(chunk(11, true))
	if ir := immediate(t, stream); ir.Status.GetCode() != 413 {
		t.Fatalf("got %d, want 413 from the installed guard", ir.Status.GetCode())
	}
	if got := heard.Load(); got != TooLargeOutcome {
		t.Fatalf("observer heard %v, want %v", got, TooLargeOutcome)
	}
}
