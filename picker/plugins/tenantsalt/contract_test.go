package tenantsalt

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"promptcache.local/picker/tenancy"

	"promptcache.local/picker/testvectors"
)

// The renderer writes this plugin's type and parameters (contract.TENANT_SALT_PARSER,
// contract.TenantSaltParam); the vectors carry them, so a name changed on one side fails.
func TestTypeAndParametersAreTheContracts(t *testing.T) {
	raw := testvectors.Vectors
	var v struct {
		Contract struct {
			TenantSaltParser     string   `json:"tenant_salt_parser"`
			TenantSaltParameters []string `json:"tenant_salt_parameters"`
			IdentityHeader       string   `json:"identity_header"`
		}
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if v.Contract.TenantSaltParser != Type {
		t.Errorf("Type %q, the renderer writes %q", Type, v.Contract.TenantSaltParser)
	}
	if v.Contract.IdentityHeader != tenancy.IdentityHeader {
		t.Errorf("identity header %q, the front reads %q", tenancy.IdentityHeader, v.Contract.IdentityHeader)
	}
	var tags []string
	typ := reflect.TypeOf(Parameters{})
	for i := 0; i < typ.NumField(); i++ {
		tags = append(tags, strings.Split(typ.Field(i).Tag.Get("json"), ",")[0])
	}
	slices.Sort(tags)
	if !slices.Equal(tags, v.Contract.TenantSaltParameters) {
		t.Errorf("parameters %v, the renderer writes %v", tags, v.Contract.TenantSaltParameters)
	}
}
