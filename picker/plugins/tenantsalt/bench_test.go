package tenantsalt

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requesthandling/parsers/openai"
)

// What the tenant-salt parser costs per request beside GIE's own OpenAI parser on the same
// body, in one run (the ratio is what the gateway_hop bench's per-core figure feels):
//
//	go test -run - -bench ParseRequest ./plugins/tenantsalt/
//
// Chat bodies of 1 KiB, 32 KiB and 1 MiB, isolation PerKey with the key in its header (the
// bench's resource, examples/minimal.yaml); the GIE arm is sent a salt, as in the bench.
// cpu-ns/op is the benchmark thread's own CPU time per request (getrusage RUSAGE_THREAD):
// on a machine shared with other work, wall-clock ns/op moves by tens of percent between
// runs, the CPU time much less.
func BenchmarkParseRequest(b *testing.B) {
	ours := parser(b, `{"isolationMode":"PerKey","saltKeyFile":"KEYFILE"}`)
	gie := openai.NewOpenAIParser()
	ctx := context.Background()
	for _, n := range []int{1 << 10, 32 << 10, 1 << 20} {
		content := strings.Repeat("lorem ipsum dolor sit amet ", n/27+1)[:n]
		body := []byte(`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` +
			content + `"}],"max_tokens":16,"stream":false}`)
		salted := []byte(strings.TrimSuffix(string(body), "}") + `,"cache_salt":"pck1-0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"}`)
		size := fmt.Sprintf("%dKiB", n>>10)
		b.Run("gie/"+size, func(b *testing.B) {
			b.SetBytes(int64(len(salted)))
			b.ReportAllocs()
			defer threadCPU(b)()
			for i := 0; i < b.N; i++ {
				if _, err := gie.ParseRequest(ctx, salted, headers()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("promptcache/"+size, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			defer threadCPU(b)()
			for i := 0; i < b.N; i++ {
				parsed, err := ours.ParseRequest(ctx, body, headers("x-prompt-cache-isolation-key", "tenant-a"))
				if err != nil || parsed.CacheSalt() == "" {
					b.Fatal(err)
				}
			}
		})
	}
}

// threadCPU locks the benchmark to its thread and, when the returned func runs, reports
// the thread's CPU time per op.
func threadCPU(b *testing.B) func() {
	runtime.LockOSThread()
	start := threadTime()
	return func() {
		b.ReportMetric(float64(threadTime()-start)/float64(b.N), "cpu-ns/op")
		runtime.UnlockOSThread()
	}
}

func threadTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
