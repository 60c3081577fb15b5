package boundary

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/spf13/pflag"
)

// The flags the picker adds to GIE's (contract.PickerFlag; the vectors hold the names to it).
const (
	FlagMaxBodyBytes       = "max-body-bytes"
	FlagBodyTimeoutSeconds = "body-timeout-seconds"
	// MaxBodyTimeoutSeconds is the API's bound on `front.bodyTimeoutSeconds`.
	MaxBodyTimeoutSeconds = 3600
)

// Flags are the two bounds as flags; zero (the default) leaves a bound off, as GIE has it.
type Flags struct {
	maxBody bytesFlag
	timeout secondsFlag
}

// AddFlags defines the flags on fs (GIE's runner parses pflag.CommandLine).
func AddFlags(fs *pflag.FlagSet) *Flags {
	f := &Flags{}
	fs.Var(&f.maxBody, FlagMaxBodyBytes,
		"largest request body, in bytes (HTTP 413 above); 0: no cap (GIE's behaviour)")
	fs.Var(&f.timeout, FlagBodyTimeoutSeconds,
		"seconds a request body may take after its headers (HTTP 408 after), and one answer "+
			"may wait for the gateway to read it (the stream ends after); 0: none (GIE's behaviour)")
	return f
}

// Limits are the parsed flags.
func (f *Flags) Limits() Limits {
	return Limits{
		MaxBodyBytes: int64(f.maxBody),
		BodyTimeout:  time.Duration(float64(f.timeout) * float64(time.Second)),
	}
}

type bytesFlag int64

func (b *bytesFlag) String() string { return strconv.FormatInt(int64(*b), 10) }
func (b *bytesFlag) Type() string   { return "bytes" }
func (b *bytesFlag) Set(s string) error {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return fmt.Errorf("want a whole number of bytes >= 0 (0: no cap), got %q", s)
	}
	*b = bytesFlag(v)
	return nil
}

type secondsFlag float64

func (t *secondsFlag) String() string { return strconv.FormatFloat(float64(*t), 'g', -1, 64) }
func (t *secondsFlag) Type() string   { return "seconds" }
func (t *secondsFlag) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || v < 0 || v > MaxBodyTimeoutSeconds {
		return fmt.Errorf("want seconds in [0, %d] (0: none), got %q", MaxBodyTimeoutSeconds, s)
	}
	*t = secondsFlag(v)
	return nil
}
