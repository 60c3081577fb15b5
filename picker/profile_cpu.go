//go:build cpuprofile

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"
)

// A build for measuring only (`go build -tags cpuprofile`): with
// PROMPTCACHE_PICKER_CPUPROFILE_DIR set, the picker writes its CPU profile there in 5 s
// windows (<pid>-<unix seconds>.pprof), since GIE's pprof handlers serve no CPU profile and
// a bench stops the picker with a signal.
func init() {
	dir := os.Getenv("PROMPTCACHE_PICKER_CPUPROFILE_DIR")
	if dir == "" {
		return
	}
	go func() {
		for {
			name := filepath.Join(dir, fmt.Sprintf("%d-%d.pprof", os.Getpid(), time.Now().Unix()))
			f, err := os.Create(name)
			if err != nil {
				return
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				f.Close()
				return
			}
			time.Sleep(5 * time.Second)
			pprof.StopCPUProfile()
			f.Close()
		}
	}()
}
