package prediction

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"testing"

	"promptcache.local/picker/testvectors"
)

type hexBytes []byte

func (h *hexBytes) UnmarshalJSON(raw []byte) error {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return err
	}
	b, err := hex.DecodeString(s)
	*h = b
	return err
}

type vectors struct {
	Contract struct {
		Header string `json:"header"`
	} `json:"contract"`
	Secret    hexBytes `json:"secret"`
	Key       hexBytes `json:"key"`
	Now       int64    `json:"now"`
	Nonce     hexBytes `json:"nonce"`
	MaxFigure int      `json:"max_figure"`
	Sign      []struct {
		MatchBlocks int    `json:"match_blocks"`
		TotalBlocks int    `json:"total_blocks"`
		BlockTokens int    `json:"block_tokens"`
		SeenBlocks  *int   `json:"seen_blocks"`
		HeldBlocks  *int   `json:"held_blocks"`
		Value       string `json:"value"`
	} `json:"sign"`
}

func load(t *testing.T) vectors {
	t.Helper()
	raw := testvectors.Prediction
	var v vectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// The header, its key and its MAC are prediction.py's, byte for byte.
func TestSignIsPythons(t *testing.T) {
	v := load(t)
	if v.Contract.Header != Header {
		t.Errorf("header %q, the front reads %q", Header, v.Contract.Header)
	}
	if v.MaxFigure != MaxFigure {
		t.Errorf("MaxFigure %d, Python's %d", MaxFigure, v.MaxFigure)
	}
	key := Key(v.Secret)
	if !bytes.Equal(key, v.Key) {
		t.Fatal("Key differs from prediction_key")
	}
	if len(v.Sign) == 0 {
		t.Fatal("no vectors")
	}
	for _, c := range v.Sign {
		p := Prediction{MatchBlocks: c.MatchBlocks, TotalBlocks: c.TotalBlocks, BlockTokens: c.BlockTokens}
		if c.SeenBlocks != nil && c.HeldBlocks != nil {
			p.Estimated, p.SeenBlocks, p.HeldBlocks = true, *c.SeenBlocks, *c.HeldBlocks
		}
		if got := Sign(key, p, v.Now, v.Nonce); got != c.Value {
			t.Errorf("%+v: got %s, Python %s", p, got, c.Value)
		}
	}
}

func TestFreshNonces(t *testing.T) {
	key := Key([]byte("0123456789abcdef"))
	p := Prediction{MatchBlocks: 1, TotalBlocks: 2, BlockTokens: 16}
	if Sign(key, p, 1, nil) == Sign(key, p, 1, nil) {
		t.Fatal("two signatures with drawn nonces must differ")
	}
}

func TestValid(t *testing.T) {
	for _, c := range []struct {
		p    Prediction
		want bool
	}{
		{Prediction{MatchBlocks: 0, TotalBlocks: 0, BlockTokens: 16}, true},
		{Prediction{MatchBlocks: 3, TotalBlocks: 2, BlockTokens: 16}, false},
		{Prediction{MatchBlocks: 1, TotalBlocks: 2, BlockTokens: 0}, false},
		{Prediction{MatchBlocks: -1, TotalBlocks: 2, BlockTokens: 16}, false},
		{Prediction{MatchBlocks: 0, TotalBlocks: MaxFigure + 1, BlockTokens: 16}, false},
		{Prediction{MatchBlocks: 1, TotalBlocks: 2, BlockTokens: 16, Estimated: true, SeenBlocks: 2, HeldBlocks: 1}, true},
		{Prediction{MatchBlocks: 1, TotalBlocks: 2, BlockTokens: 16, Estimated: true, SeenBlocks: 3, HeldBlocks: 1}, false},
	} {
		if got := c.p.Valid(); got != c.want {
			t.Errorf("%+v: Valid %v", c.p, got)
		}
	}
}
