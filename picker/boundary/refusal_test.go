package boundary

import (
	"encoding/json"
	"testing"

	"promptcache.local/picker/testvectors"
)

// The refusals and flag names crossing from Python (runtime.refusals.too_large / body_timeout,
// contract.PickerFlag), generated into the vectors by tools/picker_vectors.py.
type boundaryVectors struct {
	Boundary struct {
		Flags struct {
			MaxBodyBytes       string `json:"max_body_bytes"`
			BodyTimeoutSeconds string `json:"body_timeout_seconds"`
		} `json:"flags"`
		MaxBodyTimeoutSeconds float64 `json:"max_body_timeout_seconds"`
		TooLarge              []struct {
			Size, Limit int64
			Status      int
			Code        string
			Body        string
		} `json:"too_large"`
		BodyTimeout []struct {
			Seconds float64
			Status  int
			Code    string
			Body    string
		} `json:"body_timeout"`
	} `json:"boundary"`
}

func loadVectors(t *testing.T) boundaryVectors {
	t.Helper()
	raw := testvectors.Vectors
	var v boundaryVectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Boundary.TooLarge) == 0 || len(v.Boundary.BodyTimeout) == 0 {
		t.Fatal("no boundary vectors: run python tools/picker_vectors.py")
	}
	return v
}

func TestRefusalsAreTheFrontsByteForByte(t *testing.T) {
	v := loadVectors(t)
	for _, c := range v.Boundary.TooLarge {
		r := TooLarge(c.Size, c.Limit)
		if r.Status != c.Status || r.Code != c.Code || string(r.Body()) != c.Body {
			t.Errorf("TooLarge(%d, %d) = %d %s %s\nwant %d %s %s", c.Size, c.Limit, r.Status, r.Code, r.Body(), c.Status, c.Code, c.Body)
		}
	}
	for _, c := range v.Boundary.BodyTimeout {
		r := BodyTimeout(c.Seconds)
		if r.Status != c.Status || r.Code != c.Code || string(r.Body()) != c.Body {
			t.Errorf("BodyTimeout(%g) = %d %s %s\nwant %d %s %s", c.Seconds, r.Status, r.Code, r.Body(), c.Status, c.Code, c.Body)
		}
	}
}

func TestFlagNamesAreTheRenderers(t *testing.T) {
	v := loadVectors(t)
	if got, want := "--"+FlagMaxBodyBytes, v.Boundary.Flags.MaxBodyBytes; got != want {
		t.Errorf("flag %s, the renderer writes %s", got, want)
	}
	if got, want := "--"+FlagBodyTimeoutSeconds, v.Boundary.Flags.BodyTimeoutSeconds; got != want {
		t.Errorf("flag %s, the renderer writes %s", got, want)
	}
	if v.Boundary.MaxBodyTimeoutSeconds != MaxBodyTimeoutSeconds {
		t.Errorf("timeout bound %d, the API's %g", MaxBodyTimeoutSeconds, v.Boundary.MaxBodyTimeoutSeconds)
	}
}
