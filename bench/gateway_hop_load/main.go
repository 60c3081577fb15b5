// Command gateway_hop_load plays an Envoy gateway's ext_proc client at rate, for
// bench/gateway_hop.py: each of -concurrency workers runs one HTTP exchange after another,
// each exchange one ext_proc stream as a FULL_DUPLEX_STREAMED gateway sends it (request
// headers, the body whole or in chunks, then, after the picker's verdict, the response
// headers and the response body whole or as server-sent events). It prints one JSON
// object: exchanges, refusals, errors, latency quantiles and its own CPU time, so the
// bench can show that the load generator is not the bottleneck.
//
// Why Go: a Python grpc client costs about as much CPU per message as the policy step it
// measures, so on two shared cores it would be the bottleneck (bench/gateway_hop.py).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extproc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

type config struct {
	target      string
	concurrency int
	conns       int
	warmup      time.Duration
	duration    time.Duration
	bodies      []string
	chunk       int
	answer      []byte
	answerParts int
	keyHeader   string
	tenants     int
	path        string
}

type result struct {
	Exchanges   int                `json:"exchanges"`
	Refused     map[string]int     `json:"refused"`
	Errors      int                `json:"errors"`
	FirstError  string             `json:"first_error"`
	Seconds     float64            `json:"seconds"`
	Pick        map[string]float64 `json:"pick_ms"`
	Exchange    map[string]float64 `json:"exchange_ms"`
	CPUSeconds  float64            `json:"cpu_seconds"`
	MaxRSSBytes int64              `json:"max_rss_bytes"`
}

type sample struct{ pick, whole time.Duration }

func header(key, value string) *corev3.HeaderValue {
	return &corev3.HeaderValue{Key: key, RawValue: []byte(value)}
}

// exchange runs one HTTP request's ext_proc stream; refused is the immediate response's
// status ("" when the picker routed it).
func exchange(ctx context.Context, client extproc.ExternalProcessorClient, cfg *config, n int64) (sample, string, error) {
	body := []byte(cfg.bodies[int(n)%len(cfg.bodies)])
	start := time.Now()
	stream, err := client.Process(ctx)
	if err != nil {
		return sample{}, "", err
	}
	headers := []*corev3.HeaderValue{
		header(":method", "POST"), header(":path", cfg.path), header(":authority", "gateway.bench"),
		header(":scheme", "http"), header("content-type", "application/json"),
		header("content-length", strconv.Itoa(len(body))),
		header("x-request-id", fmt.Sprintf("bench-%d-%d", os.Getpid(), n)),
	}
	if cfg.keyHeader != "" {
		headers = append(headers, header(cfg.keyHeader, fmt.Sprintf("tenant-%d", int(n)%cfg.tenants)))
	}
	send := func(r *extproc.ProcessingRequest) error { return stream.Send(r) }
	if err := send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extproc.HttpHeaders{Headers: &corev3.HeaderMap{Headers: headers}},
	}}); err != nil {
		return sample{}, "", err
	}
	if err := sendBody(body, cfg.chunk, func(piece []byte, end bool) error {
		return send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_RequestBody{
			RequestBody: &extproc.HttpBody{Body: piece, EndOfStream: end}}})
	}); err != nil {
		return sample{}, "", err
	}
	// The request phase ends with the picker's last body response (or an immediate one).
	for {
		resp, err := stream.Recv()
		if err != nil {
			return sample{}, "", fmt.Errorf("request phase: %w", err)
		}
		if imm := resp.GetImmediateResponse(); imm != nil {
			stream.CloseSend()
			drain(stream)
			return sample{pick: time.Since(start), whole: time.Since(start)}, strconv.Itoa(int(imm.GetStatus().GetCode())), nil
		}
		if rb := resp.GetRequestBody(); rb != nil {
			mutation := rb.GetResponse().GetBodyMutation()
			if sr := mutation.GetStreamedResponse(); sr != nil && !sr.GetEndOfStream() {
				continue
			}
			break
		}
	}
	pick := time.Since(start)
	// The model server's answer, through the same stream.
	streamed := cfg.answerParts > 1
	contentType := "application/json"
	if streamed {
		contentType = "text/event-stream"
	}
	if err := send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extproc.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			header(":status", "200"), header("content-type", contentType),
		}}},
	}}); err != nil {
		return sample{}, "", err
	}
	parts := cfg.answerParts
	if parts < 1 {
		parts = 1
	}
	for i := 0; i < parts; i++ {
		if err := send(&extproc.ProcessingRequest{Request: &extproc.ProcessingRequest_ResponseBody{
			ResponseBody: &extproc.HttpBody{Body: cfg.answer, EndOfStream: i == parts-1}}}); err != nil {
			return sample{}, "", err
		}
	}
	stream.CloseSend()
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return sample{}, "", fmt.Errorf("response phase: %w", err)
		}
		if rb := resp.GetResponseBody(); rb != nil {
			sr := rb.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil || sr.GetEndOfStream() {
				drain(stream)
				break
			}
		}
	}
	return sample{pick: pick, whole: time.Since(start)}, "", nil
}

func drain(stream extproc.ExternalProcessor_ProcessClient) {
	for {
		if _, err := stream.Recv(); err != nil {
			return
		}
	}
}

func sendBody(body []byte, chunk int, send func([]byte, bool) error) error {
	if chunk <= 0 || chunk >= len(body) {
		return send(body, true)
	}
	for i := 0; i < len(body); i += chunk {
		end := min(i+chunk, len(body))
		if err := send(body[i:end], end == len(body)); err != nil {
			return err
		}
	}
	return nil
}

func quantiles(values []time.Duration) map[string]float64 {
	out := map[string]float64{}
	if len(values) == 0 {
		return out
	}
	sort.Slice(values, func(i, j int) bool { return values[i] < values[j] })
	for _, q := range []float64{0.5, 0.9, 0.99} {
		i := min(len(values)-1, int(float64(len(values))*q))
		out[fmt.Sprintf("p%g", q*100)] = float64(values[i].Microseconds()) / 1000
	}
	return out
}

func cpuSeconds() (float64, int64) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime), ru.Maxrss * 1024
}

func main() {
	cfg := config{}
	var bodyFile string
	var answerBytes int
	flag.StringVar(&cfg.target, "target", "", "host:port of the ext_proc server (plain gRPC)")
	flag.IntVar(&cfg.concurrency, "concurrency", 1, "exchanges in flight")
	flag.IntVar(&cfg.conns, "conns", 4, "HTTP/2 connections (a gateway's worker threads each keep one)")
	flag.DurationVar(&cfg.warmup, "warmup", 2*time.Second, "run before measuring")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured time")
	flag.StringVar(&bodyFile, "bodies", "", "file of request bodies, one per line")
	flag.IntVar(&cfg.chunk, "chunk", 0, "body bytes per message (0: the whole body in one)")
	flag.IntVar(&answerBytes, "answer-bytes", 512, "bytes per response body message")
	flag.IntVar(&cfg.answerParts, "answer-parts", 1, "response body messages (>1: an event stream)")
	flag.StringVar(&cfg.keyHeader, "key-header", "", "isolation key header (empty: none)")
	flag.IntVar(&cfg.tenants, "tenants", 16, "distinct isolation keys")
	flag.StringVar(&cfg.path, "path", "/v1/chat/completions", "request target")
	flag.Parse()
	raw, err := os.ReadFile(bodyFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for _, line := range strings.Split(strings.TrimRight(string(raw), "\n"), "\n") {
		cfg.bodies = append(cfg.bodies, line)
	}
	cfg.answer = []byte("data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", max(answerBytes-48, 1)) + "\"}}]}\n\n")

	clients := make([]extproc.ExternalProcessorClient, cfg.conns)
	for i := range clients {
		conn, err := grpc.NewClient(cfg.target,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
			// one connection per client: a distinct authority-free option set is not enough
			grpc.WithUserAgent(fmt.Sprintf("gateway-hop-%d", i)),
		)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		clients[i] = extproc.NewExternalProcessorClient(conn)
	}

	ctx, cancel := context.WithTimeout(context.Background(), cfg.warmup+cfg.duration+60*time.Second)
	defer cancel()
	var counter atomic.Int64
	var measuring atomic.Bool
	stop := time.Now().Add(cfg.warmup + cfg.duration)
	var mu sync.Mutex
	res := result{Refused: map[string]int{}}
	var picks, wholes []time.Duration
	var wg sync.WaitGroup
	for w := 0; w < cfg.concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			client := clients[w%len(clients)]
			for time.Now().Before(stop) {
				n := counter.Add(1)
				s, refused, err := exchange(ctx, client, &cfg, n)
				if !measuring.Load() {
					continue
				}
				mu.Lock()
				switch {
				case err != nil:
					res.Errors++
					if res.FirstError == "" {
						res.FirstError = err.Error()
					}
				case refused != "":
					res.Refused[refused]++
				default:
					res.Exchanges++
					picks = append(picks, s.pick)
					wholes = append(wholes, s.whole)
				}
				mu.Unlock()
			}
		}(w)
	}
	time.Sleep(cfg.warmup)
	cpu0, _ := cpuSeconds()
	t0 := time.Now()
	measuring.Store(true)
	fmt.Println("measuring") // the bench meters the picker pod's CPU between these lines
	time.Sleep(time.Until(stop))
	measuring.Store(false)
	res.Seconds = time.Since(t0).Seconds()
	cpu1, rss := cpuSeconds()
	fmt.Println("measured")
	wg.Wait()
	res.CPUSeconds = cpu1 - cpu0
	res.MaxRSSBytes = rss
	res.Pick = quantiles(picks)
	res.Exchange = quantiles(wholes)
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
}
