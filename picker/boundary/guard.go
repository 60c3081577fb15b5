package boundary

import (
	"errors"
	"io"
	"sync"
	"time"

	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errEnded is what the handler's own sends get once the guard ended its stream.
var errEnded = status.Error(codes.DeadlineExceeded, "promptcache picker: the stream was ended by its body or send deadline")

// Outcome names how the guard ended a stream (the refusal's code, or the send deadline).
type Outcome string

const (
	TooLargeOutcome    Outcome = CodeRequestTooLarge // 413
	BodyTimeoutOutcome Outcome = CodeBodyTimeout     // 408
	SendTimeoutOutcome Outcome = "send_timeout"      // an answer not read in time
)

// Observer hears each stream the guard ends (for a metric); it must not block.
type Observer func(Outcome)

// Wrap puts the limits in front of an ext_proc stream handler. The handler runs on a
// goroutine of its own (one that ran an earlier stream's handler when one is idle: see
// workers) so that a deadline can end the stream while it waits in Recv or Send
// (neither takes a deadline of its own): returning ends the gRPC stream, which cancels its
// context, so the handler's pending Recv or Send returns and it frees what it held.
// observe may be nil.
func Wrap(next grpc.StreamHandler, limits Limits, observe Observer) grpc.StreamHandler {
	if !limits.Enabled() {
		return next
	}
	if observe == nil {
		observe = func(Outcome) {}
	}
	handlers := newWorkers(MaxIdleWorkers)
	return func(srv any, ss grpc.ServerStream) error {
		s := &stream{ServerStream: ss, limits: limits, meter: meter{limits: limits}, ended: make(chan struct{}), observe: observe}
		done := make(chan error, 1)
		handlers.run(func() { done <- next(srv, s) })
		select {
		case err := <-done:
			s.stopTimers()
			return err
		case <-s.ended:
			s.stopTimers()
			return s.conclude()
		}
	}
}

// stream is one guarded ext_proc stream: the handler's Recv passes through the meter, its
// Send through the send deadline.
type stream struct {
	grpc.ServerStream
	limits  Limits
	observe Observer

	mu        sync.Mutex
	meter     meter
	clock     *time.Timer // the body deadline, once started
	stall     *time.Timer // the send deadline, reused for every send
	sending   bool
	sendSince time.Time
	over      bool     // the guard ended this stream: the handler gets no more messages
	late      *Refusal // set when the body deadline passed (a stall leaves it nil)
	endOnce   sync.Once
	ended     chan struct{}

	sendMu sync.Mutex // one SendMsg at a time: the handler's, or the guard's refusal
}

func (s *stream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	req, ok := m.(*extProcPb.ProcessingRequest)
	if !ok {
		return nil
	}
	s.mu.Lock()
	if s.over {
		s.mu.Unlock()
		return io.EOF
	}
	next := pass
	switch v := req.GetRequest().(type) {
	case *extProcPb.ProcessingRequest_RequestHeaders:
		next = s.meter.headers(v.RequestHeaders.GetEndOfStream())
	case *extProcPb.ProcessingRequest_RequestBody:
		next = s.meter.body(len(v.RequestBody.GetBody()), v.RequestBody.GetEndOfStream())
	}
	var refusal Refusal
	switch next {
	case startClock:
		s.clock = time.AfterFunc(s.limits.BodyTimeout, s.bodyLate)
	case stopClock:
		s.clock.Stop()
	case tooLarge:
		s.over = true
		if s.clock != nil {
			s.clock.Stop()
		}
		refusal = TooLarge(s.meter.held, s.limits.MaxBodyBytes)
	}
	s.mu.Unlock()
	if next == tooLarge {
		// The chunk that passed the cap is not handed on; the handler sees the stream
		// end (io.EOF: GIE returns without an error) and drops what it held.
		s.observe(TooLargeOutcome)
		_ = s.send(refusal.Response())
		return io.EOF
	}
	return nil
}

func (s *stream) SendMsg(m any) error {
	s.mu.Lock()
	over := s.over
	s.mu.Unlock()
	if over {
		return errEnded
	}
	return s.send(m)
}

// send is one SendMsg under the send deadline: if the gateway has not taken it within
// BodyTimeout, the stream ends (stalled).
func (s *stream) send(m any) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.limits.BodyTimeout <= 0 {
		return s.ServerStream.SendMsg(m)
	}
	s.mu.Lock()
	s.sending, s.sendSince = true, time.Now()
	if s.stall == nil {
		s.stall = time.AfterFunc(s.limits.BodyTimeout, s.stalled)
	} else {
		s.stall.Reset(s.limits.BodyTimeout)
	}
	s.mu.Unlock()
	err := s.ServerStream.SendMsg(m)
	s.mu.Lock()
	s.sending = false
	s.mu.Unlock()
	return err
}

// bodyLate runs when the body deadline passes; a body that ended meanwhile is not refused.
func (s *stream) bodyLate() {
	s.mu.Lock()
	if s.over || s.meter.ended {
		s.mu.Unlock()
		return
	}
	s.over = true
	r := BodyTimeout(s.limits.BodyTimeout.Seconds())
	s.late = &r
	s.mu.Unlock()
	s.endOnce.Do(func() { close(s.ended) })
}

// stalled runs when a send may have waited BodyTimeout; the timer is reused, so it checks
// that the send it was set for is still the one waiting.
func (s *stream) stalled() {
	s.mu.Lock()
	if s.over || !s.sending || time.Since(s.sendSince) < s.limits.BodyTimeout {
		s.mu.Unlock()
		return
	}
	s.over = true
	s.mu.Unlock()
	s.endOnce.Do(func() { close(s.ended) })
}

func (s *stream) stopTimers() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.clock != nil {
		s.clock.Stop()
	}
	if s.stall != nil {
		s.stall.Stop()
	}
}

// conclude is the stream's end once a deadline passed: a late body gets its 408 (the
// handler, waiting for the rest of the body, has sent nothing, so this small answer fits
// the stream's window; still, it is given BodyTimeout at most); a stall gets
// DEADLINE_EXCEEDED, since nobody reads an answer.
func (s *stream) conclude() error {
	s.mu.Lock()
	late := s.late
	s.mu.Unlock()
	if late == nil {
		s.observe(SendTimeoutOutcome)
		return status.Error(codes.DeadlineExceeded, "promptcache picker: the gateway took no answer within the body timeout")
	}
	s.observe(BodyTimeoutOutcome)
	sent := make(chan error, 1)
	go func() {
		s.sendMu.Lock()
		defer s.sendMu.Unlock()
		sent <- s.ServerStream.SendMsg(late.Response())
	}()
	wait := time.NewTimer(s.limits.BodyTimeout)
	defer wait.Stop()
	select {
	case err := <-sent:
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		return nil
	case <-wait.C:
		return status.Error(codes.DeadlineExceeded, "promptcache picker: the gateway took no answer within the body timeout")
	}
}
