package boundary

import "time"

// Limits bound one request's body. Zero disables a bound (GIE's own behaviour).
type Limits struct {
	MaxBodyBytes int64         // total request-body bytes one stream may deliver
	BodyTimeout  time.Duration // request headers (or first chunk) to end of body; also one send
}

// Enabled reports whether any bound is set: with none, Install leaves GIE's handler alone.
func (l Limits) Enabled() bool { return l.MaxBodyBytes > 0 || l.BodyTimeout > 0 }

// step is what the guard does after one received message.
type step int

const (
	pass       step = iota // hand the message to the handler
	startClock             // pass it, and start the body deadline
	stopClock              // pass it: the body ended, the deadline no longer applies
	tooLarge               // refuse with 413; the message is not handed on
)

// meter follows one ext_proc stream's request body. Not safe for concurrent use: the guard
// calls it under its lock.
type meter struct {
	limits  Limits
	held    int64 // request-body bytes received so far
	started bool  // the body's clock is running (or ran)
	ended   bool  // the body ended (end_of_stream seen)
}

// headers: request headers arrived; a request with a body starts its clock.
func (m *meter) headers(endOfStream bool) step {
	if endOfStream {
		m.ended = true
		return pass
	}
	return m.start()
}

// body: one request-body chunk of n bytes arrived.
func (m *meter) body(n int, endOfStream bool) step {
	if m.ended {
		return pass // nothing is buffered after the request body ended (Envoy sends none)
	}
	m.held += int64(n)
	if m.limits.MaxBodyBytes > 0 && m.held > m.limits.MaxBodyBytes {
		m.ended = true
		return tooLarge
	}
	if endOfStream {
		m.ended = true
		if m.started {
			return stopClock
		}
		return pass
	}
	return m.start()
}

func (m *meter) start() step {
	if m.started || m.limits.BodyTimeout <= 0 {
		return pass
	}
	m.started = true
	return startClock
}
