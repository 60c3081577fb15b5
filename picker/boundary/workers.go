package boundary

import "sync/atomic"

// MaxIdleWorkers bounds the goroutines kept waiting for the next stream (each keeps the
// stack it grew; the Go collector shrinks an idle one's stack, so a burst's leftovers cost
// little for long).
const MaxIdleWorkers = 128

// workers runs each guarded stream's handler on a goroutine that already ran one, when one
// is idle, instead of on a new goroutine.
//
// Why: GIE's handler needs a deep stack (encoding/json's reflection, OpenTelemetry's
// attribute sets), and a new goroutine starts small and grows by copying its stack several
// times: about 8 % of the picker's CPU at 1 KiB bodies, profiled in bench/gateway_hop. A
// goroutine that already ran a handler keeps its grown stack for the next. It is what
// grpc.NumStreamWorkers does, which GIE's runner does not set; unlike those workers, it
// never makes a stream wait (no idle goroutine: a new one), since an ext_proc stream lives
// as long as its HTTP request.
type workers struct {
	work    chan func()
	idle    atomic.Int32
	max     int32
	started atomic.Int64 // goroutines started (the tests' measure of reuse)
}

func newWorkers(maxIdle int) *workers {
	return &workers{work: make(chan func()), max: int32(maxIdle)}
}

// run runs f on an idle worker, or on a new goroutine when none is idle. It never blocks.
func (w *workers) run(f func()) {
	select {
	case w.work <- f:
	default:
		w.started.Add(1)
		go w.serve(f)
	}
}

func (w *workers) serve(f func()) {
	for {
		f()
		f = nil // nothing of the finished stream stays reachable while idle
		if w.idle.Add(1) > w.max {
			w.idle.Add(-1)
			return
		}
		f = <-w.work
		w.idle.Add(-1)
	}
}
