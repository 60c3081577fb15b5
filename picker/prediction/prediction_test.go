package prediction

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"
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
		Value       string `json:"value"`
	} `json:"sign"`
}

func load(t *testing.T) vectors {
	t.Helper()
	raw, err := os.ReadFile("../testdata/prediction_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
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
		p := Prediction{c.MatchBlocks, c.TotalBlocks, c.BlockTokens}
		if got := Sign(key, p, v.Now, v.Nonce); got != c.Value {
			t.Errorf("%+v: got %s, Python %s", p, got, c.Value)
		}
	}
}

func TestFreshNonces(t *testing.T) {
	key := Key([]byte("0123456789abcdef"))
	p := Prediction{1, 2, 16}
	if Sign(key, p, 1, nil) == Sign(key, p, 1, nil) {
		t.Fatal("two signatures with drawn nonces must differ")
	}
}

func TestValid(t *testing.T) {
	for _, c := range []struct {
		p    Prediction
		want bool
	}{
		{Prediction{0, 0, 16}, true},
		{Prediction{3, 2, 16}, false},
		{Prediction{1, 2, 0}, false},
		{Prediction{-1, 2, 16}, false},
		{Prediction{0, MaxFigure + 1, 16}, false},
	} {
		if got := c.p.Valid(); got != c.want {
			t.Errorf("%+v: Valid %v", c.p, got)
		}
	}
}
