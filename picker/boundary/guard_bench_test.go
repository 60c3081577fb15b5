package boundary

import (
	"context"
	"testing"
	"time"
)

// BenchmarkExchange is one 1 KiB exchange (headers, body, the handler's answers) over a
// real loopback gRPC stream, with the guard and without: what the bounds add per request.
//
//	go test -run - -bench Exchange ./boundary/
func BenchmarkExchange(b *testing.B) {
	for _, c := range []struct {
		name   string
		limits Limits
	}{
		{"unguarded", Limits{}},
		{"guarded", Limits{MaxBodyBytes: 1 << 20, BodyTimeout: time.Minute}},
	} {
		b.Run(c.name, func(b *testing.B) {
			handler, client := serve(b, c.limits)
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
