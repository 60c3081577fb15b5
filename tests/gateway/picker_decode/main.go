// picker_decode reads request bodies the way the Endpoint Picker (GIE v1.5.0's openai
// parser) does: encoding/json into a map (the parse must succeed), then into the request
// struct of the route, whose `cache_salt` the prefix producer hashes. Standard library
// only; the struct shapes are written here from the picker's field tags (`cache_salt`,
// `messages`, `prompt`), not copied.
//
// Protocol (stdin/stdout, one request at a time): a line "<route> <n>\n" followed by n
// body bytes; the answer is one JSON line {"ok": bool, "salt": string, "err": string,
// "forwarded": string}. `forwarded` is the body the picker hands the gateway for the model
// server: GIE v1.5.0 re-encodes the decoded map with json.Marshal (its director's
// `repackage`), so keys come out sorted, numbers as float64 and HTML characters escaped.
// With the argument "fold" it prints every non-ASCII rune whose encoding/json fold is
// ASCII, one "U+XXXX X" line each, and exits.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"unicode"
)

type message struct {
	Role    string          `json:"role,omitempty"`
	Content json.RawMessage `json:"content"`
}

type chatRequest struct {
	Messages  []message `json:"messages,omitempty"`
	CacheSalt string    `json:"cache_salt,omitempty"`
}

type completionRequest struct {
	Prompt    json.RawMessage `json:"prompt"`
	CacheSalt string          `json:"cache_salt,omitempty"`
}

type answer struct {
	OK        bool   `json:"ok"`
	Salt      string `json:"salt"`
	Err       string `json:"err"`
	Forwarded string `json:"forwarded"`
}

func decode(route string, body []byte) answer {
	bodyMap := map[string]any{}
	if err := json.Unmarshal(body, &bodyMap); err != nil {
		return answer{Err: err.Error()}
	}
	forwarded, err := json.Marshal(bodyMap)
	if err != nil {
		return answer{Err: err.Error()}
	}
	switch route {
	case "chat":
		var r chatRequest
		if err := json.Unmarshal(body, &r); err != nil {
			return answer{Err: err.Error()}
		}
		return answer{OK: true, Salt: r.CacheSalt, Forwarded: string(forwarded)}
	default:
		var r completionRequest
		if err := json.Unmarshal(body, &r); err != nil {
			return answer{Err: err.Error()}
		}
		return answer{OK: true, Salt: r.CacheSalt, Forwarded: string(forwarded)}
	}
}

func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "fold" {
		for r := rune(0x80); r <= unicode.MaxRune; r++ {
			if f := foldRune(r); f < 0x80 {
				fmt.Printf("U+%04X %c\n", r, f)
			}
		}
		return
	}
	in := bufio.NewReader(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for {
		var route string
		var n int
		if _, err := fmt.Fscanf(in, "%s %d\n", &route, &n); err != nil {
			return
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(in, body); err != nil {
			return
		}
		if err := enc.Encode(decode(route, body)); err != nil {
			return
		}
		if err := out.Flush(); err != nil {
			return
		}
	}
}
