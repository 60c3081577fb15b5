package tenancy

import (
	"bytes"
	"fmt"
	"os"
	"strings"
)

// IsolationMode is contract.IsolationMode.
type IsolationMode string

const (
	Shared   IsolationMode = "Shared"
	PerKey   IsolationMode = "PerKey"
	Required IsolationMode = "Required"
)

// MinSaltKeyBytes is settings.py's MIN_SALT_KEY_BYTES.
const MinSaltKeyBytes = 16

// pyWhitespace is what Python's bytes.strip() removes (ASCII only; bytes.TrimSpace would
// also remove U+0085 and U+00A0, which Python keeps as part of the key).
const pyWhitespace = " \t\n\r\v\f"

// Settings are the policy's settings the picker needs (settings.py's PolicySettings minus
// what only the front acts on). Header names are matched case-insensitively.
type Settings struct {
	Mode                   IsolationMode
	IsolationHeader        string
	IsolationField         string
	HonorPromptCacheMaxLen bool
	AllowClientPriority    bool
	AllowEngineState       bool
	IdentityHeader         string
	IdentityBearer         bool
	IdentityRequired       bool
}

// DefaultSettings are contract.front's defaults.
func DefaultSettings() Settings {
	return Settings{
		Mode:                   Shared,
		IsolationHeader:        "x-prompt-cache-isolation-key",
		IsolationField:         "prompt_cache_isolation_key",
		HonorPromptCacheMaxLen: true,
	}
}

// ByAccount is identity.py's identity_enabled.
func (s Settings) ByAccount() bool { return s.IdentityHeader != "" || s.IdentityBearer }

// NeedsSaltKey is contract.needs_salt_key: every mode but Shared derives salts.
func (s Settings) NeedsSaltKey() bool { return s.Mode != Shared }

// Check is settings.py's check_isolation (the grammar of header and field names is the
// renderer's business: it only renders names the API accepted).
func (s Settings) Check() error {
	switch s.Mode {
	case Shared, PerKey, Required:
	default:
		return fmt.Errorf("isolationMode %q is not one of Shared, PerKey, Required", s.Mode)
	}
	if s.Mode == Required && s.IsolationHeader == "" && s.IsolationField == "" {
		return fmt.Errorf("isolation mode Required needs an isolation header or an isolation field to carry the key; both are empty")
	}
	if s.ByAccount() && s.Mode == Shared {
		return fmt.Errorf("isolation by account derives salts, which isolation mode Shared never does; set the isolation mode to PerKey or Required, or name no identity source")
	}
	if s.IdentityRequired && !s.ByAccount() {
		return fmt.Errorf("identity required names no source for the account: set an identity header or turn on the bearer-token identity")
	}
	if h := strings.ToLower(s.IdentityHeader); h != "" && (h == strings.ToLower(s.IsolationHeader) || h == "authorization") {
		return fmt.Errorf("the identity header %q cannot also be the isolation-key header or Authorization: name the header the gateway's authentication sets", s.IdentityHeader)
	}
	return nil
}

// CleanSaltKey is the secret as settings.py's read_salt_key keeps it (ASCII whitespace
// around it removed), or an error when it is too short.
func CleanSaltKey(raw []byte) ([]byte, error) {
	secret := bytes.Trim(raw, pyWhitespace)
	if len(secret) < MinSaltKeyBytes {
		return nil, fmt.Errorf("the salt key has %d bytes; at least %d random bytes are needed", len(secret), MinSaltKeyBytes)
	}
	return secret, nil
}

// ReadSaltKey is settings.py's read_salt_key: nil for Shared (no key needed).
func ReadSaltKey(s Settings, path string) ([]byte, error) {
	if !s.NeedsSaltKey() {
		return nil, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("isolation mode %s needs the salt key, but %s cannot be read: %w", s.Mode, path, err)
	}
	secret, err := CleanSaltKey(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return secret, nil
}
