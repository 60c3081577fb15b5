// Command salting_picker is the GIE v1.5.0 Endpoint Picker with one more plugin: a request
// parser that derives the tenant's cache_salt from the isolation header the way
// promptcache.tenancy.salt.derive_salt does (HMAC-SHA256 under the pool's salt key,
// "pck1-" + unpadded URL-safe base64) and puts it where the prefix producer reads it,
// overwriting whatever salt the client sent. It measures the design with no extra hop for
// bench/gateway_hop.py; it is a prototype, not part of the product (it refuses nothing:
// the cache front in the pod still does, and still enforces isolation).
package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"

	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requesthandling/parsers/openai"
)

const parserType = "promptcache-salting-parser"

type parameters struct {
	SaltKeyFile     string `json:"saltKeyFile"`
	IsolationHeader string `json:"isolationHeader"`
}

type saltingParser struct {
	*openai.OpenAIParser
	name   fwkplugin.TypedName
	secret []byte
	header string
}

func (p *saltingParser) TypedName() fwkplugin.TypedName { return p.name }

func (p *saltingParser) salt(headers map[string]string) string {
	key := headers[p.header]
	if key == "" {
		return "" // no key: the unsalted shared scope (PerKey), as the policy decides
	}
	mac := hmac.New(sha256.New, p.secret)
	mac.Write([]byte(key))
	return "pck1-" + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func (p *saltingParser) ParseRequest(ctx context.Context, body []byte, headers map[string]string) (*scheduling.LLMRequestBody, error) {
	parsed, err := p.OpenAIParser.ParseRequest(ctx, body, headers)
	if err != nil {
		return nil, err
	}
	salt := p.salt(headers)
	switch {
	case parsed.ChatCompletions != nil:
		parsed.ChatCompletions.CacheSalt = salt
	case parsed.Completions != nil:
		parsed.Completions.CacheSalt = salt
	case parsed.Responses != nil:
		parsed.Responses.CacheSalt = salt
	case parsed.Conversations != nil:
		parsed.Conversations.CacheSalt = salt
	case parsed.Embeddings != nil:
		parsed.Embeddings.CacheSalt = salt
	}
	return parsed, nil
}

func factory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	var params parameters
	if err := json.Unmarshal(raw, &params); err != nil {
		return nil, err
	}
	secret, err := os.ReadFile(params.SaltKeyFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", parserType, err)
	}
	return &saltingParser{
		OpenAIParser: openai.NewOpenAIParser(),
		name:         fwkplugin.TypedName{Type: parserType, Name: name},
		secret:       []byte(strings.TrimSpace(string(secret))),
		header:       strings.ToLower(params.IsolationHeader),
	}, nil
}

func main() {
	fwkplugin.Register(parserType, factory)
	if err := runner.NewRunner().Run(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}
