package tenancy

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
)

// Salt prefixes: salt.py's KEYED_SALT_PREFIX, UNCACHEABLE_SALT_PREFIX, ACCOUNT_SALT_PREFIX.
const (
	KeyedSaltPrefix       = "pck1-"
	UncacheableSaltPrefix = "pcn1-"
	AccountSaltPrefix     = "pca1-"
)

var accountSaltDomain = []byte("promptcache/account-salt/v1\x00")

func encode(digest []byte) string { return base64.RawURLEncoding.EncodeToString(digest) }

func hmacSHA256(secret []byte, parts ...[]byte) []byte {
	mac := hmac.New(sha256.New, secret)
	for _, p := range parts {
		mac.Write(p)
	}
	return mac.Sum(nil)
}

// DeriveSalt is salt.py's derive_salt: HMAC-SHA256(secret, key) as "pck1-" + base64url.
func DeriveSalt(secret []byte, isolationKey string) string {
	return keyedSalt(NewMAC(secret), isolationKey)
}

func keyedSalt(mac *MAC, isolationKey string) string {
	return KeyedSaltPrefix + encode(mac.Sum([]byte(isolationKey)))
}

// DeriveAccountSalt is salt.py's derive_account_salt; key nil means the account sent none.
func DeriveAccountSalt(secret, account []byte, isolationKey *string) string {
	return accountSalt(NewMAC(secret), account, isolationKey)
}

func accountSalt(mac *MAC, account []byte, isolationKey *string) string {
	keyPart := []byte("-")
	if isolationKey != nil {
		keyPart = append([]byte("k"), *isolationKey...)
	}
	return AccountSaltPrefix + encode(mac.Sum(accountSaltDomain, account, keyPart))
}

// RandomSalt is salt.py's random_salt: a salt no other request carries (it attracts and
// shares nothing).
func RandomSalt() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return UncacheableSaltPrefix + encode(b[:])
}
