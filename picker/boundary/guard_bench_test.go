package boundary

import (
	"context"
	"testing"
	"time"
)

// BenchmarkExchange is one 1 KiB exchange (headers, body, the handler's answers) over a
// real loopback gRPC stream, with the guard and without: what the bounds add per request.
// "deep": the handler answers from about 32 KiB down its stack, as GIE's does; unguarded,
// gRPC runs each stream on a new goroutine that grows its stack to that depth, guarded,
// on a goroutine that already grew it (workers).
//
//	go test -run - -bench Exchange ./boundary/
func BenchmarkExchange(b *testing.B) {
	guarded := Limits{MaxBodyBytes: 1 << 20, BodyTimeout: time.Minute}
	for _, c := range []struct {
		name   string
		limits Limits
		deep   bool
	}{
		{"unguarded", Limits{}, false},
		{"guarded", guarded, false},
		{"unguarded/deep", Limits{}, true},
		{"guarded/deep", guarded, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			handler, client := serve(b, c.limits)
			handler.deep = c.deep
			go func() {
				for range handler.exited { // each exchange's end, unread otherwise
				}
			}()
			b.ResetTimer()
			for range b.N {
				stream, err := client.Process(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				_ = stream.Send(headers(false))
				_ = stream.Send(chunk(1024, true))
				for range 2 { // the headers' answer, the body's
					if _, err := stream.Recv(); err != nil {
						b.Fatal(err)
					}
				}
				_ = stream.CloseSend()
				_, _ = stream.Recv()
			}
		})
	}
}
