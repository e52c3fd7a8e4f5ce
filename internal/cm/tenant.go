package cm

import (
	"bytes"
	"errors"
	"fmt"
)

// A tenant name, given at connect (capability C12), says which of the
// responder's STag tables the connection reaches. It rides in the MPA
// private data between gowarp peers as the RFC 7306 offer does (ext.go):
// a block of the name, its length and tenantMagic, before the offer block
// if there is one, so that each side strips the offer first and then the
// name. Only an initiator asked to name a tenant sends one; a responder
// answers with the same block, and only to a request that carried one, so
// the initiator knows its name was taken (a peer that does not know the
// block would leave the connection on its default table); neither
// application sees the blocks.
const MaxTenantLen = 64

var tenantMagic = [4]byte{'g', 'w', 'T', '1'}

// Errors of tenant names.
var (
	// ErrBadTenant: a tenant name that is empty where one is needed,
	// longer than MaxTenantLen, or not printable ASCII without spaces.
	ErrBadTenant = errors.New("gowarp: bad tenant name")
	// ErrTenantRefused: the responder's reply did not confirm the tenant
	// name the request carried (a peer that does not know tenants).
	ErrTenantRefused = errors.New("gowarp: responder did not take the tenant name")
)

// CheckTenant checks a tenant name: 1 to MaxTenantLen bytes of printable
// ASCII other than space.
func CheckTenant(name string) error {
	if name == "" || len(name) > MaxTenantLen {
		return fmt.Errorf("%w: %d bytes, 1 to %d allowed", ErrBadTenant, len(name), MaxTenantLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("%w: byte %#02x at %d", ErrBadTenant, c, i)
		}
	}
	return nil
}

// tenantBlockLen is the length of the block naming tenant (0 for none).
func tenantBlockLen(tenant string) int {
	if tenant == "" {
		return 0
	}
	return len(tenant) + 1 + len(tenantMagic)
}

// appendTenant appends the block naming tenant to pd (see blocks.go).
func appendTenant(pd []byte, tenant string) []byte {
	pd = append(append(pd, tenant...), byte(len(tenant)))
	return append(pd, tenantMagic[:]...)
}

// CutTenant returns pd without the tenant block it ends with, and the
// name; pd is returned whole, with no name, when it ends with none. A
// block whose magic is there but whose length or name is not valid is
// ErrBadTenant.
func CutTenant(pd []byte) ([]byte, string, error) {
	m := len(pd) - len(tenantMagic)
	if m < 1 || !bytes.Equal(pd[m:], tenantMagic[:]) {
		return pd, "", nil
	}
	n := int(pd[m-1])
	start := m - 1 - n
	if n == 0 || start < 0 {
		return pd, "", fmt.Errorf("%w: a block of %d bytes says the name has %d", ErrBadTenant, len(pd), n)
	}
	name := string(pd[start : m-1])
	if err := CheckTenant(name); err != nil {
		return pd, "", err
	}
	return pd[:start:start], name, nil
}
