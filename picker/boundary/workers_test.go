package boundary

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// eventually polls cond for up to 10 s: goroutines exit and park asynchronously.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("not within 10 s: %s", what)
}

func TestWorkersNeverMakeAStreamWait(t *testing.T) {
	w := newWorkers(4)
	release := make(chan struct{})
	var started sync.WaitGroup
	const n = 16 // more than the idle cap: every one runs at once all the same
	started.Add(n)
	for range n {
		w.run(func() { started.Done(); <-release })
	}
	started.Wait()
	close(release)
}

func TestWorkersReuseAnIdleGoroutineAndKeepAtMostTheCap(t *testing.T) {
	w := newWorkers(2)
	release := make(chan struct{})
	var started, finished sync.WaitGroup
	started.Add(5)
	finished.Add(5)
	for range 5 {
		w.run(func() { started.Done(); <-release; finished.Done() })
	}
	started.Wait()
	if got := w.started.Load(); got != 5 {
		t.Fatalf("5 streams at once ran on %d goroutines", got)
	}
	close(release)
	finished.Wait()
	eventually(t, "two workers idle", func() bool { return w.idle.Load() == 2 })
	// One stream after another: each takes an idle worker, no goroutine is started.
	for range 10 {
		done := make(chan struct{})
		w.run(func() { close(done) })
		<-done
		eventually(t, "the worker idle again", func() bool { return w.idle.Load() == 2 })
		if got := w.started.Load(); got != 5 {
			t.Fatalf("a stream with workers idle started a goroutine: %d started", got)
		}
	}
}

func TestWorkersBeyondTheCapExit(t *testing.T) {
	w := newWorkers(1)
	release := make(chan struct{})
	var started, exited sync.WaitGroup
	started.Add(3)
	exited.Add(3)
	for range 3 {
		w.run(func() { started.Done(); <-release; exited.Done() })
	}
	started.Wait()
	before := runtime.NumGoroutine()
	close(release)
	exited.Wait()
	// Two of the three goroutines end (one stays idle): never more than the cap waits.
	eventually(t, "the goroutines over the idle cap gone", func() bool {
		return w.idle.Load() == 1 && runtime.NumGoroutine() <= before-2
	})
}
